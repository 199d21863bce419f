"""Running an app's serve() for one HTTP request: the runtime's request, tracing, metrics, errors."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.trace import Tracer
from pydantic import BaseModel, ValidationError
from starlette.requests import HTTPConnection

from prismserve.app import App
from prismserve.errors import AppResponseError
from prismserve.gateway.chat import parse_chat_json, speaks_chat
from prismserve.gateway.errors import HTTPError, as_http_error, invalid
from prismserve.gateway.http import malformed_json, request_id, state
from prismserve.gateway.metrics import GatewayMetrics
from prismserve.runtime import Runtime
from prismserve.task.context import RequestContext


def find_app(runtime: Runtime, name: str) -> App:
    """The registered app `name`; an UnknownAppError (404) lists the registered ones."""
    return runtime.registry.get(name)


def parse_request(app: App, body: bytes) -> BaseModel:
    """The body as the app's request type; 400 for malformed JSON or invalid fields.

    Chat requests carry their images and audio as base64, and are checked like OpenAI requests.
    Other apps parse the body in pydantic's JSON mode (their bytes fields follow their config), with
    the parser of `parse_json`, so malformed bodies get the same 400 as on every other route.
    """
    if speaks_chat(app):
        return parse_chat_json(app, body)
    try:
        return app.parse_request(body)
    except ValidationError as exc:
        malformed = [e["msg"] for e in exc.errors() if e["type"] == "json_invalid"]
        if malformed:
            raise malformed_json(malformed[0].removeprefix("Invalid JSON: ")) from None
        raise invalid(exc, f"invalid request for app {app.name!r}: ") from None


def request_type(request: BaseModel) -> str:
    """The metrics label of a request's type: the request's own `request_type` (chat requests by
    modality, `image+text->audio`; image requests `text->image`), else `default`."""
    kind = getattr(request, "request_type", None)
    return kind if isinstance(kind, str) else "default"


def serving(request: HTTPConnection, app: App, body: BaseModel) -> Served:
    """Start serving `body` through `app` for the HTTP `request` or WebSocket session (its gateway,
    its request id)."""
    gateway = state(request)
    served = Served(gateway.runtime, gateway.metrics, gateway.tracer, app, body, request_id(request))
    served.parent = propagate.extract(request.headers)  # a caller's `traceparent`: its trace goes on
    gateway.controls.observe(app.name, served.kind)  # counted by the app's re-planning watcher, if any
    return served


class Served:
    """One request being served through an app: its span, its metrics, its errors as HTTPError."""

    def __init__(
        self,
        runtime: Runtime,
        metrics: GatewayMetrics,
        tracer: Tracer,
        app: App,
        request: BaseModel,
        request_id: str,
    ) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.tracer = tracer
        self.app = app
        self.request = request
        self.request_id = request_id
        self.kind = request_type(request)
        self.start = time.perf_counter()
        self.first: float | None = None  # when the first chunk went out (streams)
        self.sent = 0  # chunks sent
        self.speech_s = 0.0  # seconds of speech answered
        # The request's context: its prompt tokens as its calls counted them (its TTFT target).
        self.context: RequestContext | None = None
        self.parent: Context | None = None  # the trace the caller's request is part of, if any

    async def response(self) -> BaseModel:
        """The whole (non-streaming) response; the span records the error itself, the client gets `failure`'s."""
        try:
            with self.tracer.start_as_current_span(
                "prismserve.request", context=self.parent, attributes=self._attributes()
            ):
                async with self.runtime.request(self.app.name, self.kind, self.request_id) as self.context:
                    result = await self.app.serve(self.request)
                    self._speech(result)
                    if self.app.streaming:
                        raise AppResponseError("the app streams: ask for its answer as a stream")
        except asyncio.CancelledError:
            self._done("cancelled")
            raise
        except Exception as exc:
            self._done("error")
            raise self.failure(exc) from exc
        self._done("ok")
        return result  # type: ignore[return-value]

    async def chunks(self) -> AsyncGenerator[BaseModel, None]:
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
            with self.tracer.start_as_current_span(
                "prismserve.request", context=self.parent, attributes=self._attributes()
            ):
                async with self.runtime.request(self.app.name, self.kind, self.request_id) as self.context:
                    async for chunk in _as_stream(await self.app.serve(self.request)):
                        if self.first is None:
                            self.first = time.perf_counter()
                            elapsed = self.first - self.start
                            self.metrics.first_chunk.labels(self.app.name, self.kind).observe(elapsed)
                        self.sent += 1
                        self._speech(chunk)
                        await queue.put(("chunk", chunk))
            status = "ok"
            await queue.put(("end", None))
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the reader as an HTTP error
            await queue.put(("error", self.failure(exc)))
        finally:
            self._done(status)

    def failure(self, error: Exception) -> HTTPError:
        """What the client gets for `error`; a 5xx's details go to the log under the request id."""
        return as_http_error(error, self.request_id, f"app {self.app.name!r}")

    def _attributes(self) -> dict[str, Any]:
        return {
            "prismserve.app": self.app.name,
            "prismserve.request_type": self.kind,
            "prismserve.request_id": self.request_id,
        }

    def _speech(self, part: Any) -> None:
        """Count the speech in a chunk or a whole answer (16-bit mono PCM at its `sample_rate`)."""
        audio = getattr(part, "audio", None)
        if not audio:
            return
        if not self.speech_s:
            elapsed = time.perf_counter() - self.start
            self.metrics.first_audio.labels(self.app.name, self.kind).observe(elapsed)
        self.speech_s += len(audio) / 2 / part.sample_rate

    def _done(self, status: str) -> None:
        end = time.perf_counter()
        self.metrics.requests.labels(self.app.name, self.kind, status).inc()
        self.metrics.latency.labels(self.app.name, self.kind).observe(end - self.start)
        if status == "ok" and self.speech_s:
            self.metrics.real_time_factor.labels(self.app.name, self.kind).observe(
                (end - self.start) / self.speech_s
            )
        slo = self.app.slo(self.kind)
        if slo is not None and status != "cancelled":  # a client that left says nothing of the SLO
            first = self.first if self.first is not None else end  # a whole response: all at once
            tbt = (end - first) / (self.sent - 1) if self.sent > 1 else None
            ledger = self.context.ledger if self.context is not None else None
            met = status == "ok" and slo.met(
                first - self.start, tbt, end - self.start, ledger.tokens if ledger is not None else 0
            )
            self.metrics.slo_outcome(self.app.name, self.kind, met)


async def _as_stream(result: Any) -> AsyncIterator[BaseModel]:
    if isinstance(result, BaseModel):
        yield result
    else:
        async for chunk in result:
            yield chunk
