"""Built-in tasks: composites every app can use (more with the model executors)."""

from prismserve.tasklib.router import Router

__all__ = ["Router"]
