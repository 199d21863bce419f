"""Tracing set-up and trace-context propagation; log lines with the request's id."""

from prismserve.observability.logs import setup_logging
from prismserve.observability.tracing import extract_context, get_tracer, inject_context, setup_tracing

__all__ = ["extract_context", "get_tracer", "inject_context", "setup_logging", "setup_tracing"]
