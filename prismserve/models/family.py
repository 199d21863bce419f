"""A model family as a plugin: which checkpoints it takes, the adapter that loads them, and the app
`prismserve serve MODEL` serves them with (as data: an app module and its settings, which
`prismserve.apps` turns into the app's source).

Families are found through the `prismserve.models` entry point group (`prismserve.models.builtin`);
each entry point names a `ModelFamily`. prismserve's own families are declared there too.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prismserve.task.components import Dtype

ENTRY_POINT_GROUP = "prismserve.models"

Engine = Literal["transformers", "vllm"]


class SettingError(ValueError):
    """An engine or deployment setting the family (or the chosen engine) does not take; the message
    says which and what to do instead."""


class EngineSettings(BaseModel):
    """How the default app runs the model (`prismserve serve MODEL` flags); None leaves the family's
    default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Engine | None = None
    dtype: Dtype | None = None
    max_model_len: int | None = Field(default=None, ge=16)
    quantization: str | None = Field(default=None, min_length=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    prefill_decode: bool | None = None  # the LLM stage as a prefill and a decode deployment (vLLM)


# Settings only vLLM engines take (the transformers engines have no fixed context length and run a
# replica on one device).
VLLM_ONLY = ("max_model_len", "quantization", "tensor_parallel_size", "prefill_decode")


class DefaultApp(BaseModel):
    """A family's default app, as data: the app `module` (an import path: `prismserve.apps.mllm`,
    `prismserve.apps.omni`, `prismserve.apps.image`, or a plugin's own) and the `settings` the family
    gives its `SETTINGS` statement; the checkpoint (`model`) and the engine flags (`engine`, `vllm`,
    `gpus`) are filled in when it is served. `doc` becomes the written app's docstring."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    module: str = Field(pattern=r"^[A-Za-z_][\w.]*$")
    doc: str
    settings: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class ModelFamily:
    """One model family: what `prismserve` needs to detect, load and serve its checkpoints.

    `model_types` are the config.json `model_type`s it takes (a diffusers pipeline: its
    model_index.json `_class_name`); `adapter` is the import path (`module:Class`) of its adapter
    (`prismserve.models.base.Adapter`); `app` its default app (`prismserve.apps.default_app_source`
    writes it for a local checkpoint path and the engine settings); `engines` are the engines that app
    can run its main stage on, the first the default; `main` is the component
    `--gpu-memory-utilization` and `--tensor-parallel-size` size; `tiny` the import path of a builder
    of a tiny random-weight checkpoint (a function of the target directory), if any.
    """

    name: str
    model_types: tuple[str, ...]
    adapter: str
    app: DefaultApp
    engines: tuple[Engine, ...] = ("transformers",)
    main: str = "llm"
    tiny: str | None = None
    description: str = field(default="", compare=False)

    def adapter_class(self) -> Any:
        """The adapter class, imported now."""
        return load_object(self.adapter)

    def checked(self, settings: EngineSettings) -> EngineSettings:
        """`settings` with the engine filled in; a `SettingError` for one that does not apply."""
        engine = settings.engine or self.engines[0]
        if engine not in self.engines:
            raise SettingError(
                f"{self.name} does not run on --engine {engine}; engines: {', '.join(self.engines)}"
            )
        if engine != "vllm":
            given = [name for name in VLLM_ONLY if getattr(settings, name) not in (None, False)]
            if given:
                flags = ", ".join("--" + name.replace("_", "-") for name in given)
                hint = " (add --engine vllm)" if "vllm" in self.engines else ""
                raise SettingError(
                    f"{flags} only appl{'ies' if len(given) == 1 else 'y'} to the vLLM engine, not {engine}{hint}"
                )
        return settings.model_copy(update={"engine": engine})


def load_object(path: str) -> Any:
    """The object an import path `module:attribute` names."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
