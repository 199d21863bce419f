"""Toy components: tiny stand-ins for encoders, an LLM, a talker and a vocoder, with fake executors.

They exercise the task layer, apps and the demo without any model weights.
"""
