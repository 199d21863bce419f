"""Wire types shared by every layer: chat and image requests and their chunks and responses.

The app layer, the task library, the executors and the gateway all speak these; none of them
owns them, so the task library needs nothing of the app layer.
"""
