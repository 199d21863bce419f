"""The HTTP gateway: admin API, app invoke API, OpenAI-compatible chat completions, health, metrics."""

from prismserve.gateway.server import DEFAULT_MAX_REQUEST_BYTES, create_gateway

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "create_gateway"]
