"""Tracing and metrics set-up."""

from prismserve.observability.tracing import setup_tracing

__all__ = ["setup_tracing"]
