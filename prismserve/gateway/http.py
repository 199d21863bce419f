"""HTTP helpers shared by the routes: body limits, SSE framing, the gateway's state."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pydantic_core
from fastapi import Request
from opentelemetry.trace import Tracer
from pydantic import BaseModel

from prismserve.gateway.errors import HTTPError
from prismserve.gateway.metrics import GatewayMetrics
from prismserve.runtime import Runtime


@dataclass
class GatewayState:
    """What the routes need, kept on `app.state.gateway`."""

    runtime: Runtime
    metrics: GatewayMetrics
    tracer: Tracer
    admin_token: str
    max_request_bytes: int


def state(request: Request) -> GatewayState:
    """The gateway state of the app serving `request`."""
    return request.app.state.gateway


async def read_body(request: Request) -> bytes:
    """The request body; 413 when it is larger than the gateway accepts."""
    limit = state(request).max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"request body of {int(declared)} bytes is larger than the limit of {limit} bytes")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise HTTPError(413, f"request body is larger than the limit of {limit} bytes")
    return bytes(body)


def parse_json(body: bytes) -> Any:
    """JSON of the body; 400 when malformed."""
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HTTPError(400, f"malformed JSON: {exc}") from None


def json_of(model: BaseModel) -> str:
    """The model as JSON with bytes as base64 (pydantic's default, UTF-8, cannot carry audio or images)."""
    if model.model_config.get("ser_json_bytes", "utf8") != "utf8":
        return model.model_dump_json()
    return pydantic_core.to_json(model.model_dump(), bytes_mode="base64").decode()


def sse_event(data: str, event: str | None = None) -> bytes:
    """One server-sent event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


async def sse_chunks(first: BaseModel | None, rest: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    """Chunks as SSE `data:` events, then `[DONE]`; an error mid-stream becomes an `error` event."""
    try:
        if first is not None:
            yield sse_event(json_of(first))
            async for chunk in rest:
                yield sse_event(json_of(chunk))
    except HTTPError as exc:
        yield sse_event(json.dumps({"error": {"message": exc.message, "type": exc.kind, "code": exc.status}}), "error")
        return
    yield sse_event("[DONE]")
