"""The gateway: a FastAPI app over a runtime — admin, inference and OpenAI APIs, health, metrics."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from opentelemetry.trace import TracerProvider
from starlette.exceptions import HTTPException as StarletteHTTPException

from prismserve import __version__
from prismserve.control import Controls
from prismserve.errors import NotFoundError, PrismserveError
from prismserve.gateway import admin, audio_api, images_api, inference, models_api, openai_api, realtime
from prismserve.gateway.api_key import UNAUTHORIZED, require_api_key
from prismserve.gateway.durable import DurableState
from prismserve.gateway.errors import HTTPError, as_http_error, invalid
from prismserve.gateway.http import GatewayState, request_id, state
from prismserve.gateway.media import MediaPolicy
from prismserve.gateway.metrics import GatewayMetrics
from prismserve.gateway.middleware import RequestIds
from prismserve.gateway.openapi import allowed_methods, openapi_document
from prismserve.gateway.trace_recorder import TraceRecorder
from prismserve.observability import get_tracer
from prismserve.protocol.admin import Health
from prismserve.runtime import Runtime

DEFAULT_MAX_REQUEST_BYTES = 64 << 20


def create_gateway(
    runtime: Runtime,
    *,
    admin_token: str,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    media: MediaPolicy | None = None,
    tracer_provider: TracerProvider | None = None,
    lifespan: Any = None,
    trace: TraceRecorder | None = None,
    durable: DurableState | None = None,
) -> FastAPI:
    """The HTTP app serving `runtime`'s apps.

    With `api_key`, every /v1 route needs `Authorization: Bearer <api_key>` (the admin routes keep
    `admin_token`). Media URLs in chat requests are fetched under `media` (default `MediaPolicy()`:
    any public host). Request spans go to `tracer_provider` (default: the process's global one);
    `lifespan`, if given, starts and stops the runtime with the server. With `trace`, every answered
    chat completion is logged to it (`--record-trace`). With `durable`, the admin API's changes are
    kept in its file (`--state`; the server restores them at start).
    """
    if not admin_token:
        raise ValueError("the admin token must not be empty")
    if api_key == "":
        raise ValueError("the API key must not be empty (None leaves the /v1 routes open)")
    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be positive, not {max_request_bytes}")
    app = FastAPI(title="prismserve", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan)
    tracer = get_tracer("prismserve.gateway", tracer_provider)
    controls = Controls(runtime)
    app.state.gateway = GatewayState(
        runtime,
        controls,
        GatewayMetrics(runtime, controls),
        tracer,
        admin_token,
        max_request_bytes,
        api_key,
        media or MediaPolicy(),
        trace,
        durable,
    )
    app.include_router(admin.router)
    keyed: dict[str, Any] = (
        {"dependencies": [Depends(require_api_key)], "responses": UNAUTHORIZED} if api_key else {}
    )
    for router in (
        inference.router,
        openai_api.router,
        images_api.router,
        audio_api.router,
        models_api.router,
    ):
        app.include_router(router, **keyed)
    app.include_router(realtime.router)  # a WebSocket: it checks the API key itself
    app.add_middleware(RequestIds)  # request ids, and every other exception as a 500 (no Exception handler)

    @app.exception_handler(HTTPError)
    @app.exception_handler(PrismserveError)
    async def _error(request: Request, exc: Exception) -> JSONResponse:
        response = as_http_error(exc, request_id(request)).response(request_id(request))
        if response.status_code == 401:
            response.headers["www-authenticate"] = "Bearer"
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return as_http_error(invalid(exc), request_id(request)).response(request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes (404) and methods (405, with its Allow header), in the one error body.
        if exc.status_code == 404:
            error = as_http_error(NotFoundError(str(exc.detail)), request_id(request))
        else:
            error = HTTPError(exc.status_code, str(exc.detail), "invalid_request_error")
        response = error.response(request_id(request))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            response.headers["allow"] = allowed_methods(request.app, request.url.path)
        return response

    @app.get("/health", response_model=Health)
    async def health(request: Request) -> Health:
        """Liveness: the gateway answers and knows its apps."""
        return Health(status="ok", apps=sorted(state(request).runtime.registry.apps))

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> Response:
        """Prometheus metrics, in the text exposition format."""
        return Response(await state(request).metrics.scrape(), media_type="text/plain; version=0.0.4")

    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]

    return app
