"""Admin API: register, unregister and list apps, deploy plans, status. Bearer token required."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from prismserve.app import App
from prismserve.control import Plan
from prismserve.errors import AuthError, NotFoundError, PlacementError
from prismserve.gateway.http import read_model, state
from prismserve.gateway.openapi import errors, json_body
from prismserve.gateway.serving import find_app
from prismserve.protocol.admin import AppInfo, AppList, Deployed, RegisterApp, RuntimeStatus, Unregistered

# Declares the scheme in /openapi.json; auto_error=False: a missing token is our 401 with our error body.
_bearer = HTTPBearer(
    scheme_name="AdminToken",
    description="The admin token (PRISMSERVE_ADMIN_TOKEN, or the one `prismserve serve` prints at start).",
    auto_error=False,
)


def require_admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
) -> None:
    """401 unless the request carries the admin bearer token (compared in constant time)."""
    token = credentials.credentials if credentials is not None else ""
    if not (token and hmac.compare_digest(token.encode(), state(request).admin_token.encode())):
        raise AuthError("admin API: missing or wrong bearer token (Authorization: Bearer <token>)")


router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)], responses=errors(401))


def describe(app: App) -> AppInfo:
    """An app as the admin API lists it."""
    return AppInfo(
        name=app.name,
        request_model=app.request_model.__name__,
        response_model=app.response_model.__name__,
        streaming=app.streaming,
        input_modalities=sorted(app.config.input_modalities),
        output_modalities=sorted(app.config.output_modalities),
        deployments={path: task.deployment_key() for path, task in app.named_unit_tasks().items()},
    )


@router.post(
    "/apps",
    status_code=201,
    response_model=AppInfo,
    openapi_extra=json_body(RegisterApp),
    responses=errors(400, 409, 413, 415, 500, 502, 503),
)
async def register(request: Request) -> AppInfo:
    """Register an app from its source: load, validate, deploy what it needs."""
    body = await read_model(request, RegisterApp)
    gateway = state(request)
    try:
        app = await gateway.runtime.register_app(body.source, body.name, filename=f"{body.name}.py")
    except PlacementError as exc:
        raise PlacementError(f"app {body.name!r} cannot be deployed: {exc}") from None
    gateway.controls.registered(app)
    if gateway.durable is not None:
        gateway.durable.app_registered(app.name, body.source)
    return describe(app)


@router.delete("/apps/{name:path}", response_model=Unregistered, responses=errors(404, 500))
async def unregister(name: str, request: Request) -> Unregistered:
    """Unregister an app; deployments no other app uses stop."""
    gateway = state(request)
    await gateway.controls.unregistered(name)
    await gateway.runtime.unregister_app(name)
    if gateway.durable is not None:
        gateway.durable.app_unregistered(name)
    return Unregistered(unregistered=name)


@router.get("/apps", response_model=AppList, responses=errors(500))
async def list_apps(request: Request) -> AppList:
    """Every registered app."""
    return AppList(apps=[describe(app) for app in state(request).runtime.registry.apps.values()])


@router.post(
    "/apps/{name:path}/plan",
    response_model=Deployed,
    openapi_extra=json_body(Plan),
    responses=errors(400, 404, 409, 413, 415, 500, 502),
)
async def deploy(name: str, request: Request) -> Deployed:
    """Deploy or scale a plan for an app: cells, routing probabilities, sim profiles (a real model's
    deployment only where the plan's `emulate` names it), deployment options. A plan posted here
    takes over from re-planning: the app's watcher (`serve --gpus`) stops."""
    gateway = state(request)
    find_app(gateway.runtime, name)
    plan = await read_model(request, Plan, "invalid plan: ")
    await gateway.controls.plan_posted(name)
    await gateway.runtime.deploy(name, plan)
    if gateway.durable is not None:
        gateway.durable.plan_posted(name, plan)
    return Deployed(app=name, gpus=plan.total_gpus, replicas=plan.replicas())


@router.get("/apps/{name:path}/plan", response_model=Plan, responses=errors(404, 500))
async def deployed_plan(name: str, request: Request) -> Plan:
    """The plan deployed for an app (posted, or planned at start by `serve --gpus`); 404 when none is."""
    runtime = state(request).runtime
    find_app(runtime, name)
    plan = runtime.plans.get(name)
    if plan is None:
        raise NotFoundError(f"app {name!r} has no plan deployed: each of its deployments runs one replica")
    return plan


@router.get("/status", response_model=RuntimeStatus, responses=errors(500))
async def status(request: Request) -> RuntimeStatus:
    """Apps, deployments, replicas, cells."""
    return RuntimeStatus.model_validate(state(request).runtime.status())
