"""Running an app's serve() for one HTTP request: dispatcher, request scope, tracing, metrics, errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from opentelemetry.trace import Tracer
from pydantic import BaseModel, ValidationError

from prismserve.app import App, AppRegistryError
from prismserve.gateway.chat import parse_chat_json, speaks_chat
from prismserve.gateway.errors import HTTPError, validation_message
from prismserve.gateway.http import state
from prismserve.gateway.metrics import GatewayMetrics
from prismserve.runtime import Runtime
from prismserve.task import DispatchError, InvalidInputError, TaskError, use_dispatcher

log = logging.getLogger(__name__)

_CLIENT_REQUEST_ID = re.compile(r"^[\w.:-]{1,128}$")


def request_id(request: Request) -> str:
    """The client's `X-Request-Id` when it is a sane token, else a fresh one."""
    given = request.headers.get("x-request-id", "")
    return given if _CLIENT_REQUEST_ID.match(given) else uuid.uuid4().hex


def find_app(runtime: Runtime, name: str) -> App:
    """The registered app `name`, or a 404 listing the registered ones."""
    try:
        return runtime.registry.get(name)
    except AppRegistryError as exc:
        raise HTTPError(404, str(exc), "not_found_error") from None


def parse_request(app: App, body: bytes) -> BaseModel:
    """The body as the app's request type; 400 for malformed JSON, 422 for invalid fields.

    Chat requests carry their images and audio as base64, and are checked like OpenAI requests.
    """
    if speaks_chat(app):
        return parse_chat_json(app, body)
    try:
        return app.parse_request(body)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise HTTPError(400, f"malformed JSON: {exc.errors()[0]['msg']}") from None
        raise HTTPError(422, f"invalid request for app {app.name!r}: {validation_message(exc)}") from None


def request_type(request: BaseModel) -> str:
    """The metrics label of a request's type: the request's own `request_type` (chat requests by
    modality, `image+text->audio`; image requests `text->image`), else `default`."""
    kind = getattr(request, "request_type", None)
    return kind if isinstance(kind, str) else "default"


def rejected_input(error: BaseException | None) -> InvalidInputError | None:
    """The InvalidInputError behind `error` (itself or a cause), if a unit task rejected the request's content."""
    while error is not None:
        if isinstance(error, InvalidInputError):
            return error
        error = error.__cause__
    return None


def failure(app: App, error: Exception) -> HTTPError:
    """The HTTP error for an exception raised while serving."""
    if isinstance(error, HTTPError):
        return error
    if rejected_input(error) is not None:
        return HTTPError(400, f"app {app.name!r}: {rejected_input(error)}", "invalid_input")
    if isinstance(error, DispatchError):
        return HTTPError(502, f"app {app.name!r}: {error}", "executor_error")
    if isinstance(error, TaskError):
        return HTTPError(500, f"app {app.name!r}: {error}", "app_error")
    log.exception("app %s failed", app.name, exc_info=error)
    return HTTPError(500, f"app {app.name!r} failed: {type(error).__name__}: {error}", "app_error")


def serving(request: Request, app: App, body: BaseModel) -> Served:
    """Start serving `body` through `app` for the HTTP `request` (its gateway, its request id)."""
    gateway = state(request)
    return Served(gateway.runtime, gateway.metrics, gateway.tracer, app, body, request_id(request))


class Served:
    """One request being served through an app: its span, its metrics, its errors as HTTPError."""

    def __init__(
        self, runtime: Runtime, metrics: GatewayMetrics, tracer: Tracer, app: App, request: BaseModel, request_id: str
    ) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.tracer = tracer
        self.app = app
        self.request = request
        self.request_id = request_id
        self.kind = request_type(request)
        self.start = time.perf_counter()

    async def response(self) -> BaseModel:
        """The whole (non-streaming) response."""
        with self.tracer.start_as_current_span("prismserve.request", attributes=self._attributes()):
            try:
                async with self.runtime.request_scope(self.app.name):
                    with use_dispatcher(self.runtime.dispatcher):
                        result = await self.app.serve(self.request)
                        if self.app.streaming:
                            raise HTTPError(500, f"app {self.app.name!r} streams; ask for it as a stream")
            except asyncio.CancelledError:
                self._done("cancelled")
                raise
            except Exception as exc:
                self._done("error")
                raise failure(self.app, exc) from exc
        self._done("ok")
        return result  # type: ignore[return-value]

    async def chunks(self) -> AsyncIterator[BaseModel]:
        """The streamed chunks; an error before the first chunk raises HTTPError, a later one too.

        serve() runs in a task of its own (its context variables must not hop between the tasks
        that pull the HTTP body); closing this iterator — the client went away — cancels it.
        """
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=64)
        producer = asyncio.get_running_loop().create_task(self._produce(queue))
        try:
            while True:
                kind, value = await queue.get()
                if kind == "chunk":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer

    async def _produce(self, queue: asyncio.Queue[tuple[str, Any]]) -> None:
        status = "error"
        try:
            with self.tracer.start_as_current_span("prismserve.request", attributes=self._attributes()):
                async with self.runtime.request_scope(self.app.name):
                    with use_dispatcher(self.runtime.dispatcher):
                        first = True
                        async for chunk in _as_stream(await self.app.serve(self.request)):
                            if first:
                                elapsed = time.perf_counter() - self.start
                                self.metrics.first_chunk.labels(self.app.name, self.kind).observe(elapsed)
                                first = False
                            await queue.put(("chunk", chunk))
            status = "ok"
            await queue.put(("end", None))
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the reader as an HTTP error
            await queue.put(("error", failure(self.app, exc)))
        finally:
            self._done(status)

    def _attributes(self) -> dict[str, Any]:
        return {
            "prismserve.app": self.app.name,
            "prismserve.request_type": self.kind,
            "prismserve.request_id": self.request_id,
        }

    def _done(self, status: str) -> None:
        self.metrics.requests.labels(self.app.name, self.kind, status).inc()
        self.metrics.latency.labels(self.app.name, self.kind).observe(time.perf_counter() - self.start)


async def _as_stream(result: Any) -> AsyncIterator[BaseModel]:
    if isinstance(result, BaseModel):
        yield result
    else:
        async for chunk in result:
            yield chunk
