"""`prismserve serve`: start the runtime and the gateway, register an app, apply a plan."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from prismserve.app import AppLoadError, load_app
from prismserve.gateway.errors import validation_message
from prismserve.gateway.server import create_gateway
from prismserve.observability import setup_tracing
from prismserve.runtime import DeploymentPlan, create_runtime

TOKEN_VARIABLE = "PRISMSERVE_ADMIN_TOKEN"


@dataclass
class ServeOptions:
    """What `prismserve serve` was asked to do."""

    app_path: str
    name: str | None = None
    plan_path: str | None = None
    fake_gpus: int | None = None
    address: str | None = None
    routing: str = "static"
    host: str = "127.0.0.1"
    port: int = 8000


class StartupError(Exception):
    """The server cannot start as asked; the message says why."""


def _load_plan(path: str | None) -> DeploymentPlan | None:
    if path is None:
        return None
    try:
        return DeploymentPlan.model_validate(json.loads(Path(path).read_text()))
    except OSError as exc:
        raise StartupError(f"{path}: cannot read plan: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise StartupError(f"{path}: malformed JSON: {exc}") from None
    except ValidationError as exc:
        raise StartupError(f"{path}: invalid plan: {validation_message(exc)}") from None


def run_server(options: ServeOptions) -> int:
    """Serve until interrupted; returns the exit code."""
    import uvicorn

    try:
        app = load_app(options.app_path, options.name)  # report a bad app before anything starts
        plan = _load_plan(options.plan_path)
        runtime = create_runtime(address=options.address, fake_gpus=options.fake_gpus, policy=options.routing)
    except (AppLoadError, StartupError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    token = os.environ.get(TOKEN_VARIABLE) or secrets.token_urlsafe(24)
    generated = TOKEN_VARIABLE not in os.environ
    source = Path(options.app_path).read_text()
    setup_tracing("prismserve-gateway")

    @contextlib.asynccontextmanager
    async def lifespan(_: object) -> AsyncIterator[None]:
        await runtime.start()
        try:
            await runtime.register_app(source, app.name, filename=options.app_path)
            if plan is not None:
                await runtime.deploy(app.name, plan)
        except Exception as exc:
            print(f"error: {exc}", file=sys.stderr)
            await runtime.close()
            raise
        url = f"http://{options.host}:{options.port}"
        print(f"prismserve: serving app {app.name!r} at {url}", flush=True)
        if generated:
            print(f"prismserve: admin token (shown once; set {TOKEN_VARIABLE} to choose it): {token}", flush=True)
        try:
            yield
        finally:
            await runtime.close()

    gateway = create_gateway(runtime, admin_token=token, lifespan=lifespan)
    uvicorn.run(gateway, host=options.host, port=options.port, log_level="warning")
    return 0
