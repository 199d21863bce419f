"""Per-model-family adapters: how to load, split and reassemble a checkpoint (see `base.Adapter`)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from prismserve.errors import UnknownModelError
from prismserve.models.base import Adapter, Encoded, EngineModel, Generated, MediaError, MediaInput

# config.json `model_type` (diffusers: the pipeline class) -> the adapter class, imported when a replica
# needs it. The one place that says which adapter loads which checkpoints.
ADAPTERS: dict[str, str] = {
    "qwen2_5_vl": "prismserve.models.qwen2_5_vl:Qwen25VL",
    "qwen2_5_omni": "prismserve.models.qwen2_5_omni:Qwen25Omni",
    "qwen3_omni_moe": "prismserve.models.qwen3_omni:Qwen3Omni",
    "QwenImagePipeline": "prismserve.models.qwen_image:QwenImage",
    "internvl": "prismserve.models.internvl:InternVL",
    "gemma3": "prismserve.models.gemma3:Gemma3",
}


def model_type(path: str) -> str:
    """The checkpoint's `model_type` from its config.json, or a diffusers pipeline's class name from
    its model_index.json (a local directory or a cached hub id)."""
    for name, key in (("model_index.json", "_class_name"), ("config.json", "model_type")):
        if (Path(path) / name).is_file():
            return json.loads((Path(path) / name).read_text())[key]
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path).model_type
    except OSError as exc:
        raise UnknownModelError(
            f"cannot find a checkpoint at {path!r} (a local directory or a cached hub id): {exc}"
        ) from None


def adapter_for(path: str, device: str | None = None) -> Any:
    """The adapter of the checkpoint at `path` (an `Adapter` for multimodal LLM families, `QwenImage`
    for the image pipeline)."""
    kind = model_type(path)
    if kind not in ADAPTERS:
        raise UnknownModelError(f"{path}: no adapter for model_type {kind!r}; supported: {sorted(ADAPTERS)}")
    module, _, name = ADAPTERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)(path, device)


__all__ = [
    "ADAPTERS",
    "Adapter",
    "Encoded",
    "EngineModel",
    "Generated",
    "MediaError",
    "MediaInput",
    "UnknownModelError",
    "adapter_for",
    "model_type",
]
