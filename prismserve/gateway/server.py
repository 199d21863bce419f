"""The gateway: a FastAPI app over a runtime — admin, inference and OpenAI APIs, health, metrics."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from opentelemetry.trace import TracerProvider
from starlette.exceptions import HTTPException as StarletteHTTPException

from prismserve import __version__
from prismserve.gateway import admin, images_api, inference, openai_api
from prismserve.gateway.errors import HTTPError, validation_message
from prismserve.gateway.http import GatewayState, request_id, state
from prismserve.gateway.metrics import GatewayMetrics
from prismserve.gateway.middleware import RequestIds
from prismserve.observability import get_tracer
from prismserve.runtime import Runtime

DEFAULT_MAX_REQUEST_BYTES = 64 << 20


def create_gateway(
    runtime: Runtime,
    *,
    admin_token: str,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    tracer_provider: TracerProvider | None = None,
    lifespan: Any = None,
) -> FastAPI:
    """The HTTP app serving `runtime`'s apps.

    Request spans go to `tracer_provider` (default: the process's global one); `lifespan`, if
    given, starts and stops the runtime with the server.
    """
    if not admin_token:
        raise ValueError("the admin token must not be empty")
    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be positive, not {max_request_bytes}")
    app = FastAPI(title="prismserve", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan)
    tracer = get_tracer("prismserve.gateway", tracer_provider)
    app.state.gateway = GatewayState(runtime, GatewayMetrics(runtime), tracer, admin_token, max_request_bytes)
    app.include_router(admin.router)
    app.include_router(inference.router)
    app.include_router(openai_api.router)
    app.include_router(images_api.router)
    app.add_middleware(RequestIds)  # request ids, and every other exception as a 500 (no Exception handler)

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
        return exc.response(request_id(request))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return HTTPError(422, validation_message(exc)).response(request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return HTTPError(exc.status_code, str(exc.detail)).response(request_id(request))

    @app.get("/health")
    async def health(request: Request) -> dict[str, object]:
        """Liveness: the gateway answers and knows its apps."""
        return {"status": "ok", "apps": sorted(state(request).runtime.registry.apps)}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """Prometheus metrics."""
        return Response(state(request).metrics.exposition(), media_type="text/plain; version=0.0.4")

    return app
