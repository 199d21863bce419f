"""Per-model-family adapters: how to load, split and reassemble a checkpoint (see `base.Adapter`)."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from prismserve.errors import UnknownModelError
from prismserve.models.base import Adapter, Encoded, EngineModel, Generated, MediaError, MediaInput
from prismserve.models.family import ENTRY_POINT_GROUP, DefaultApp, EngineSettings, ModelFamily, SettingError


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


def families() -> list[ModelFamily]:
    """Every model family: prismserve's own and those of installed plugins (the `prismserve.models`
    entry point group, each naming a `ModelFamily`), read afresh on each call."""
    from prismserve.models.builtin import BUILTIN

    found = {family.name: family for family in BUILTIN}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            family = entry.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is named, not a traceback
            raise UnknownModelError(
                f"model family plugin {entry.name!r} ({entry.value}) does not load: {exc}"
            ) from None
        if not isinstance(family, ModelFamily):
            raise UnknownModelError(
                f"model family plugin {entry.name!r} ({entry.value}) is a {type(family).__name__}, "
                "not a prismserve.models.ModelFamily"
            )
        found[family.name] = family
    return list(found.values())


def family_of(kind: str) -> ModelFamily:
    """The family that takes checkpoints of `model_type` (or diffusers pipeline class) `kind`."""
    for family in families():
        if kind in family.model_types:
            return family
    supported = sorted(t for family in families() for t in family.model_types)
    raise UnknownModelError(
        f"no model family takes model_type {kind!r}; supported: {', '.join(supported)} "
        "(a plugin adds more: docs/models.md, 'Writing a family plugin')"
    )


def family_for(path: str) -> ModelFamily:
    """The family of the checkpoint at `path` (a local directory or a cached hub id)."""
    return family_of(model_type(path))


def voices(model: str) -> tuple[str, ...]:
    """The speakers of checkpoint `model` (a local directory, or a hub id in the cache: a served
    model is there), its default first; () for a family that does not speak."""
    from prismserve.models.hub import resolve_checkpoint

    path = resolve_checkpoint(model, offline=True)
    return tuple(family_for(str(path)).adapter_class().voices(path))


def adapter_for(path: str, device: str | None = None, dtype: str = "auto") -> Any:
    """The adapter of the checkpoint at `path` (an `Adapter` for multimodal LLM families, `QwenImage`
    for the image pipeline), loading its weights in `dtype` (`ModelSettings.dtype`)."""
    return family_for(path).adapter_class()(path, device, dtype)


__all__ = [
    "ENTRY_POINT_GROUP",
    "Adapter",
    "DefaultApp",
    "Encoded",
    "EngineModel",
    "EngineSettings",
    "Generated",
    "MediaError",
    "MediaInput",
    "ModelFamily",
    "SettingError",
    "UnknownModelError",
    "adapter_for",
    "families",
    "family_for",
    "family_of",
    "model_type",
    "voices",
]
