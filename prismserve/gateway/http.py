"""HTTP helpers of the routes: request ids, body checks, JSON parsing, SSE framing, the gateway's state."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pydantic_core
from fastapi import Request
from opentelemetry.trace import Tracer
from pydantic import BaseModel, ValidationError
from starlette.requests import HTTPConnection

from prismserve.control import Controls
from prismserve.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError
from prismserve.gateway.durable import DurableState
from prismserve.gateway.errors import HTTPError, invalid
from prismserve.gateway.media import MediaPolicy
from prismserve.gateway.metrics import GatewayMetrics
from prismserve.gateway.trace_recorder import TraceRecorder
from prismserve.runtime import Runtime


@dataclass
class GatewayState:
    """What the routes need, kept on `app.state.gateway`."""

    runtime: Runtime
    controls: Controls  # the apps' control loops: fed each request's type and SLO outcome
    metrics: GatewayMetrics
    tracer: Tracer
    admin_token: str
    max_request_bytes: int
    api_key: str | None = None  # the /v1 routes' bearer key; None: they are open
    media: MediaPolicy = field(default_factory=MediaPolicy)  # how chat requests' media URLs are fetched
    trace: TraceRecorder | None = None  # `--record-trace`: where answered chat requests are logged
    durable: DurableState | None = None  # `--state`: the admin API's changes, kept across restarts


_CLIENT_REQUEST_ID = re.compile(r"^[\w.:-]{1,128}$")


def state(request: HTTPConnection) -> GatewayState:
    """The gateway state of the app serving `request`."""
    return request.app.state.gateway


def new_request_id(given: str) -> str:
    """The client's `X-Request-Id` when it is a sane token, else a fresh one."""
    return given if _CLIENT_REQUEST_ID.match(given) else uuid.uuid4().hex


def request_id(request: HTTPConnection) -> str:
    """The id RequestIds gave `request`: in its response's `X-Request-Id`, its error body, its log lines."""
    return request.state.request_id


def is_json(content_type: str | None) -> bool:
    """True for `application/json` and `application/*+json` (any parameters), and for no type at all:
    clients that send none (raw sockets, some scripts) mean JSON on these routes."""
    if content_type is None:
        return True
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_body(request: Request) -> bytes:
    """The body of a JSON route's request; 415 for another Content-Type, 413 when it is larger than
    the gateway accepts (the one body-size limit of every route)."""
    content_type = request.headers.get("content-type")
    if not is_json(content_type):
        raise UnsupportedMediaTypeError(
            f"Content-Type {content_type!r} is not accepted: send the body as JSON with Content-Type: application/json"
        )
    return await read_bytes(request)


async def read_bytes(request: Request) -> bytes:
    """The request's body, whatever its type; 413 when it is larger than the gateway accepts."""
    limit = state(request).max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(
            f"request body of {int(declared)} bytes is larger than the limit of {limit} bytes"
        )
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise PayloadTooLargeError(f"request body is larger than the limit of {limit} bytes")
    return bytes(body)


# What to change, for the parser's (jiter's) terse reasons that a client cannot act on as they stand.
_JSON_HINTS = {
    "recursion limit": "nest arrays and objects at most 200 levels deep",
    "number out of range": "send numbers of at most 4300 digits",
    "surrogate": "strings must be valid Unicode: a \\ud800-\\udfff escape needs its pair",
    "hex escape": "a \\u escape takes four hex digits, and a surrogate needs its pair",
    "unicode code point": "send the body as UTF-8",
}


def malformed_json(reason: str) -> InvalidRequestError:
    """The 400 for a body the JSON parser refused, with a hint when the reason is terse."""
    hint = next((hint for key, hint in _JSON_HINTS.items() if key in reason), None)
    return InvalidRequestError(f"malformed JSON: {reason}" + (f" ({hint})" if hint else ""))


def parse_json(body: bytes) -> Any:
    """JSON of the body; 400 when malformed.

    pydantic's parser, the one pydantic uses for `model_validate_json`, so every route refuses the
    same bodies: too deep, numbers too long, lone surrogates (which no response could encode).
    """
    try:
        return pydantic_core.from_json(body)
    except ValueError as exc:
        raise malformed_json(str(exc)) from None


Body = TypeVar("Body", bound=BaseModel)
Item = TypeVar("Item")


async def read_model(request: Request, model: type[Body], what: str = "") -> Body:
    """The request's JSON body as `model`, validated strictly (`"stream": 0` is no boolean), as
    /openapi.json documents it; a 400 starting with `what` for fields that do not validate."""
    payload = parse_json(await read_body(request))
    try:
        return model.model_validate(payload, strict=True)
    except ValidationError as exc:
        raise invalid(exc, what) from None


def json_of(model: BaseModel) -> str:
    """The model as JSON with bytes as base64 (pydantic's default, UTF-8, cannot carry audio or images)."""
    if model.model_config.get("ser_json_bytes", "utf8") != "utf8":
        return model.model_dump_json()
    return pydantic_core.to_json(model.model_dump(), bytes_mode="base64").decode()


def sse_event(data: str, event: str | None = None) -> bytes:
    """One server-sent event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


def error_event(error: HTTPError, request_id: str) -> bytes:
    """The `error` event that ends a stream whose status code was already sent."""
    return sse_event(json.dumps(error.body(request_id)), "error")


async def merged(streams: list[AsyncGenerator[Item, None]]) -> AsyncGenerator[Item, None]:
    """The items of every stream as they come (one stream: itself, with no task between); the first
    error ends it, and leaving it (or an error) closes every stream."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as only:
            async for item in only:
                yield item
        return
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=64)

    async def pump(stream: AsyncGenerator[Item, None]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for item in stream:
                    await queue.put(("item", item))
            await queue.put(("end", None))
        except Exception as exc:  # noqa: BLE001 - handed to the reader
            await queue.put(("error", exc))

    pumps = [asyncio.ensure_future(pump(stream)) for stream in streams]
    try:
        ended = 0
        while ended < len(streams):
            kind, value = await queue.get()
            if kind == "item":
                yield value
            elif kind == "error":
                raise value
            else:
                ended += 1
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def sse_chunks(
    first: BaseModel | None,
    rest: AsyncIterator[BaseModel],
    request_id: str,
    failure: Callable[[Exception], HTTPError],
) -> AsyncIterator[bytes]:
    """Chunks as SSE `data:` events, then `[DONE]`; any error mid-stream becomes an `error` event
    (`failure` maps it), so that the stream never ends without saying why."""
    try:
        if first is not None:
            yield sse_event(json_of(first))
            async for chunk in rest:
                yield sse_event(json_of(chunk))
    except Exception as exc:  # noqa: BLE001 - the client hears of it as an error event
        yield error_event(failure(exc), request_id)
        return
    yield sse_event("[DONE]")
