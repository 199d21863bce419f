"""A model family as a plugin: which checkpoints it takes, the adapter that loads them, and the app
`prismserve serve MODEL` builds for them.

Families are found through the `prismserve.models` entry point group (`prismserve.models.builtin`);
each entry point names a `ModelFamily`. prismserve's own families are declared there too.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
    dtype: str | None = None
    max_model_len: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    tensor_parallel_size: int | None = Field(default=None, ge=1)


# Settings only vLLM engines take (the transformers engines load in the checkpoint's dtype, have no
# fixed context length and run a replica on one device).
VLLM_ONLY = ("dtype", "max_model_len", "tensor_parallel_size")


@dataclass(frozen=True)
class ModelFamily:
    """One model family: what `prismserve` needs to detect, load and serve its checkpoints.

    `model_types` are the config.json `model_type`s it takes (a diffusers pipeline: its
    model_index.json `_class_name`); `adapter` is the import path (`module:Class`) of its adapter
    (`prismserve.models.base.Adapter`); `app` writes the source of its default app for a local
    checkpoint path and the engine settings (see `chat_app`); `engines` are the engines that app can
    run its main stage on, the first the default; `main` is the component `--gpu-memory-utilization`
    and `--tensor-parallel-size` size; `tiny` the import path of a builder of a tiny random-weight
    checkpoint (a function of the target directory), if any.
    """

    name: str
    model_types: tuple[str, ...]
    adapter: str
    app: Callable[[str, EngineSettings], str]
    engines: tuple[Engine, ...] = ("transformers",)
    main: str = "llm"
    tiny: str | None = None
    description: str = field(default="", compare=False)

    def adapter_class(self) -> Any:
        """The adapter class, imported now."""
        return load_object(self.adapter)

    def app_source(self, model: str, settings: EngineSettings | None = None) -> str:
        """The default app's source for the checkpoint at `model` (a local path, written in as a
        literal); raises `SettingError` for settings this family or engine does not take."""
        settings = self.checked(settings or EngineSettings())
        return self.app(model, settings)

    def checked(self, settings: EngineSettings) -> EngineSettings:
        """`settings` with the engine filled in; a `SettingError` for one that does not apply."""
        engine = settings.engine or self.engines[0]
        if engine not in self.engines:
            raise SettingError(
                f"{self.name} does not run on --engine {engine}; engines: {', '.join(self.engines)}"
            )
        if engine != "vllm":
            given = [name for name in VLLM_ONLY if getattr(settings, name) is not None]
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


def main_gpus(settings: EngineSettings, main: str) -> tuple[dict[str, float], dict[str, Any]]:
    """The composite's `gpus` and vLLM `engine_args` the GPU settings make for component `main`:
    tensor parallelism is whole GPUs, a memory share is a share of one (with tensor parallelism, vLLM's
    own `gpu_memory_utilization`)."""
    tp, share = settings.tensor_parallel_size, settings.gpu_memory_utilization
    if tp is not None and tp > 1:
        return {main: float(tp)}, ({"gpu_memory_utilization": share} if share is not None else {})
    if share is not None:
        return {main: share}, {}
    return {}, {}


_CHAT_APP = '''\
"""{doc}

Written by `prismserve serve` for the checkpoint at MODEL; copy it to compose the model differently.
"""

from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import {imports}

MODEL = {model!r}
model = {task}(
{arguments})


class Config(AppConfig):
    tasks = {{"model": model}}
    input_modalities = frozenset({inputs!r})
    output_modalities = frozenset({outputs!r})


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await model(request)):
        yield chunk
'''


_IMAGE_APP = '''\
"""{doc}

Written by `prismserve serve` for the checkpoint at MODEL; copy it to compose the model differently.
"""

from prismserve.app import AppConfig
from prismserve.protocol.images import ImageRequest, ImageResponse
from prismserve.tasklib.imagegen import ImageGenTask, image_response

MODEL = {model!r}
model = ImageGenTask(
{arguments})


class Config(AppConfig):
    tasks = {{"model": model}}


async def serve(request: ImageRequest) -> ImageResponse:
    return await image_response(await model(request))
'''


def _arguments(values: dict[str, Any]) -> str:
    return "".join(
        f"    {name}={'MODEL' if name == 'model' else repr(value)},\n" for name, value in values.items()
    )


def _engine_arguments(settings: EngineSettings, main: str) -> dict[str, Any]:
    gpus, engine_args = main_gpus(settings, main)
    values: dict[str, Any] = {}
    if settings.engine == "vllm":
        values["engine"] = "vllm"
        vllm: dict[str, Any] = {}
        if settings.dtype is not None:
            vllm["dtype"] = settings.dtype
        if settings.max_model_len is not None:
            vllm["max_model_len"] = settings.max_model_len
        if engine_args:
            vllm["engine_args"] = engine_args
        if vllm:
            values["vllm"] = vllm
    if gpus:
        values["gpus"] = gpus
    return values


def chat_app(
    task: Literal["MLLMTask", "OmniTask"],
    doc: str,
    inputs: frozenset[str],
    outputs: frozenset[str] = frozenset({"text"}),
    **fields: Any,
) -> Callable[[str, EngineSettings], str]:
    """The `app` of a chat family whose default app is one `MLLMTask` or `OmniTask` (encoders
    fissioned) with `fields`, streaming its answer over `/v1/chat/completions`."""

    def source(model: str, settings: EngineSettings) -> str:
        main = "thinker" if task == "OmniTask" else "llm"
        values = {"model": model, "encoder_fission": True, **fields, **_engine_arguments(settings, main)}
        return _CHAT_APP.format(
            doc=doc,
            model=model,
            imports=f"{task}, chat_chunks",
            task=task,
            arguments=_arguments(values),
            inputs=sorted(inputs),
            outputs=sorted(outputs),
        )

    return source


def image_app(doc: str) -> Callable[[str, EngineSettings], str]:
    """The `app` of a diffusers text-to-image family: `ImageGenTask` with the text encoder fissioned,
    over `/v1/images/generations`."""

    def source(model: str, settings: EngineSettings) -> str:
        gpus, _ = main_gpus(settings, "generator")
        values = {"model": model, "text_encoder_fission": True, **({"gpus": gpus} if gpus else {})}
        return _IMAGE_APP.format(doc=doc, model=model, arguments=_arguments(values))

    return source
