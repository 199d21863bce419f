"""The admin API's and the health route's wire types (`/admin/...`, `/health`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class RegisterApp(BaseModel):
    """Body of POST /admin/apps: the app's name and its Python source."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "echo", "source": "..."}]})

    name: str = Field(min_length=1, max_length=64)
    source: str = Field(min_length=1)


class AppInfo(BaseModel):
    """An app as the admin API lists it."""

    name: str
    request_model: str = Field(description="the model its serve() takes (ChatRequest, ImageRequest …)")
    response_model: str = Field(description="the model it answers with (the chunk model when it streams)")
    streaming: bool
    input_modalities: list[str]
    output_modalities: list[str]
    deployments: dict[str, str] = Field(description="unit-task path -> deployment key")


class AppList(BaseModel):
    """Every registered app."""

    apps: list[AppInfo]


class Unregistered(BaseModel):
    """The answer of DELETE /admin/apps/{name}."""

    unregistered: str


class Deployed(BaseModel):
    """The answer of POST /admin/apps/{name}/plan: the GPUs and replicas of the plan applied."""

    app: str
    gpus: int
    replicas: dict[str, int]


class RuntimeStatus(BaseModel):
    """`runtime.status()`: apps, deployments, replicas, cells (its layout is the runtime's)."""

    model_config = ConfigDict(extra="allow")

    apps: dict[str, Any]
    deployments: dict[str, Any]


class Health(BaseModel):
    """Liveness: the gateway answers and knows its apps."""

    status: str
    apps: list[str]
