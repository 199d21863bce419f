"""Tracing set-up and trace-context propagation."""

from prismserve.observability.tracing import extract_context, get_tracer, inject_context, setup_tracing

__all__ = ["extract_context", "get_tracer", "inject_context", "setup_tracing"]
