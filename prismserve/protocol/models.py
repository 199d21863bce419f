"""`GET /v1/models`: OpenAI's model list, one entry per served app."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ModelCard(BaseModel):
    """One served app, as OpenAI lists a model; `root` (the checkpoint) and `max_model_len` are
    vLLM's extensions, present when the app says."""

    id: str = Field(description="The app name: the `model` of chat and image requests")
    object: Literal["model"] = "model"
    created: int = Field(description="When the app was registered (Unix seconds)")
    owned_by: str = "prismserve"
    root: str | None = Field(default=None, description="The checkpoint the app serves, when it names one")
    max_model_len: int | None = Field(default=None, description="The LLM's context length, when fixed")
    input_modalities: list[str] = Field(description="What the app's chat requests may carry")
    output_modalities: list[str] = Field(description="What the app can answer with")


class ModelList(BaseModel):
    """OpenAI's list shape: `{"object": "list", "data": [...]}`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
