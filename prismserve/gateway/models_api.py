"""OpenAI-compatible `GET /v1/models`: the served apps, as OpenAI and vLLM list models."""

from __future__ import annotations

from fastapi import APIRouter, Request

from prismserve.app import App
from prismserve.gateway.http import state
from prismserve.gateway.openapi import errors
from prismserve.protocol.images import ImageRequest
from prismserve.protocol.models import ModelCard, ModelList

router = APIRouter()


def model_card(app: App) -> ModelCard:
    """The list entry of `app`: its checkpoint is the app module's `MODEL` (what `prismserve serve
    MODEL` writes), its context length the app's (`App.context_length`), if known."""
    root = getattr(app.module, "MODEL", None)
    return ModelCard(
        id=app.name,
        created=int(app.created),
        root=root if isinstance(root, str) else None,
        max_model_len=app.context_length,
        input_modalities=sorted(app.config.input_modalities),
        output_modalities=(
            ["image"] if issubclass(app.request_model, ImageRequest) else sorted(app.config.output_modalities)
        ),
    )


@router.get("/v1/models", response_model=ModelList, response_model_exclude_none=True, responses=errors(500))
async def list_models(request: Request) -> ModelList:
    """The served apps, each as a model (`id` = the `model` of chat and image requests)."""
    apps = state(request).runtime.registry.apps.values()
    return ModelList(data=[model_card(app) for app in sorted(apps, key=lambda app: app.name)])


@router.get(
    "/v1/models/{name:path}",
    response_model=ModelCard,
    response_model_exclude_none=True,
    responses=errors(404, 500),
)
async def retrieve_model(name: str, request: Request) -> ModelCard:
    """One served app, as a model; 404 when no app has that name."""
    return model_card(state(request).runtime.registry.get(name))
