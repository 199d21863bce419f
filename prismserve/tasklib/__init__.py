"""Built-in tasks: composites every app can use (more with the model executors)."""

from prismserve.tasklib.router import Router, chat_request_type

__all__ = ["Router", "chat_request_type"]
