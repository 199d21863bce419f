"""Admin API: register, unregister and list apps, deploy plans, status. Bearer token required."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field, ValidationError

from prismserve.app import App, AppLoadError, AppRegistryError
from prismserve.executors.envs import EnvironmentMissing
from prismserve.gateway.errors import HTTPError, validation_message
from prismserve.gateway.http import parse_json, read_body, state
from prismserve.gateway.serving import find_app
from prismserve.planner import Plan
from prismserve.runtime.resources import PlacementError


def require_admin(request: Request) -> None:
    """401 unless the request carries the admin bearer token."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    expected = state(request).admin_token
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), expected.encode()):
        raise HTTPError(
            401, "admin API: missing or wrong bearer token (Authorization: Bearer <token>)", "auth_error"
        )


router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])


class RegisterApp(BaseModel):
    """Body of POST /admin/apps."""

    name: str = Field(min_length=1, max_length=64)
    source: str = Field(min_length=1)


def describe(app: App) -> dict[str, Any]:
    """An app as the admin API lists it."""
    return {
        "name": app.name,
        "request_type": app.request_type.__name__,
        "response_type": app.response_type.__name__,
        "streaming": app.streaming,
        "input_modalities": sorted(app.config.input_modalities),
        "output_modalities": sorted(app.config.output_modalities),
        "deployments": {path: task.deployment_key() for path, task in app.named_unit_tasks().items()},
    }


@router.post("/apps", status_code=201)
async def register(request: Request) -> dict[str, Any]:
    """Register an app from its source."""
    try:
        body = RegisterApp.model_validate(parse_json(await read_body(request)))
    except ValidationError as exc:
        raise HTTPError(422, validation_message(exc)) from None
    try:
        app = await state(request).runtime.register_app(body.source, body.name, filename=f"{body.name}.py")
    except AppLoadError as exc:
        raise HTTPError(400, str(exc)) from None
    except AppRegistryError as exc:
        raise HTTPError(409, str(exc), "conflict_error") from None
    except PlacementError as exc:
        raise HTTPError(409, f"app {body.name!r} cannot be deployed: {exc}", "capacity_error") from None
    except EnvironmentMissing as exc:
        raise HTTPError(503, f"app {body.name!r} cannot be deployed: {exc}", "environment_error") from None
    return describe(app)


@router.delete("/apps/{name}")
async def unregister(name: str, request: Request) -> dict[str, str]:
    """Unregister an app; deployments no other app uses stop."""
    try:
        await state(request).runtime.unregister_app(name)
    except AppRegistryError as exc:
        raise HTTPError(404, str(exc), "not_found_error") from None
    return {"unregistered": name}


@router.get("/apps")
async def list_apps(request: Request) -> dict[str, Any]:
    """Every registered app."""
    return {"apps": [describe(app) for app in state(request).runtime.registry.apps.values()]}


@router.post("/apps/{name}/plan")
async def deploy(name: str, request: Request) -> dict[str, Any]:
    """Deploy or scale a plan for an app: cells, routing probabilities, sim profiles."""
    runtime = state(request).runtime
    find_app(runtime, name)
    try:
        plan = Plan.model_validate(parse_json(await read_body(request)))
    except ValidationError as exc:
        raise HTTPError(422, f"invalid plan: {validation_message(exc)}") from None
    try:
        await runtime.deploy(name, plan)
    except PlacementError as exc:
        raise HTTPError(409, str(exc), "capacity_error") from None
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None
    return {"app": name, "gpus": plan.total_gpus, "replicas": plan.replicas()}


@router.get("/status")
async def status(request: Request) -> dict[str, Any]:
    """Apps, deployments, replicas, cells."""
    return state(request).runtime.status()
