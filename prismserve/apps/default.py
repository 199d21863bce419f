"""A family's default app as source: its `DefaultApp` (an app module and the family's settings) with
the checkpoint and the engine flags filled in."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import ValidationError

from prismserve.app.settings import SETTINGS_NAME, AppSettings, app_module_source
from prismserve.models.family import EngineSettings, ModelFamily, SettingError

WRITTEN = (
    "Written by `prismserve serve` from `{module}`, with its SETTINGS filled in: edit it and serve\n"
    "it with `prismserve serve FILE`."
)


def default_app_source(
    family: ModelFamily,
    model: str,
    settings: EngineSettings | None = None,
    gpus: dict[str, float] | None = None,
) -> str:
    """The source of `family`'s default app for the checkpoint at `model` (a local path, written in
    as the `model` setting), its components given `gpus` (shares laid out by `serve.fit`); a
    `SettingError` for settings this family or engine does not take."""
    engine = family.checked(settings or EngineSettings())
    app = family.app
    values = {**app.settings, "model": model, **engine_fields(engine, family.main)}
    if engine.engine == "vllm" and "video" in values.get("modalities", ()):
        # prismserve's vLLM executors take no video yet: no video encoder to start, and the gateway
        # refuses a clip at once instead of after encoding it.
        values["modalities"] = tuple(m for m in values["modalities"] if m != "video")
    if gpus:
        values["gpus"] = {**values.get("gpus", {}), **gpus}
    chosen = _settings(family, values)
    return app_module_source(app.module, chosen, doc=f"{app.doc}\n\n{WRITTEN.format(module=app.module)}")


def engine_fields(settings: EngineSettings, main: str) -> dict[str, Any]:
    """The app settings the engine flags make for a family whose main component is `main`: `dtype`
    (every component's, on either engine), `engine` and `vllm` on vLLM, `prefill_decode` when asked,
    `gpus` when a GPU share or tensor parallelism is given (tensor parallelism is whole GPUs; a memory
    share is a share of one, with tensor parallelism vLLM's own setting)."""
    values: dict[str, Any] = {}
    if settings.dtype is not None:
        values["dtype"] = settings.dtype
    tp, share = settings.tensor_parallel_size, settings.gpu_memory_utilization
    if settings.engine == "vllm":
        vllm: dict[str, Any] = {}
        if settings.max_model_len is not None:
            vllm["max_model_len"] = settings.max_model_len
        if settings.quantization is not None:
            vllm["quantization"] = settings.quantization
        if tp is not None and tp > 1 and share is not None:
            vllm["engine_args"] = {"gpu_memory_utilization": share}
        values["engine"] = "vllm"
        if vllm:
            values["vllm"] = vllm
    # Split into prefill and decode, the main component is two deployments, each sized alike.
    sized = ("prefill", "decode") if settings.prefill_decode else (main,)
    if settings.prefill_decode:
        values["prefill_decode"] = True
    if tp is not None and tp > 1:
        values["gpus"] = dict.fromkeys(sized, float(tp))
    elif share is not None:
        values["gpus"] = dict.fromkeys(sized, share)
    return values


def _settings(family: ModelFamily, values: dict[str, Any]) -> AppSettings:
    """The family's app settings, validated by the class its app module's `SETTINGS` statement builds."""
    module = family.app.module
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        raise SettingError(
            f"{family.name}'s default app {module} does not import ({exc}): install it, or fix the "
            "family's DefaultApp(module=...)"
        ) from None
    kind = type(getattr(imported, SETTINGS_NAME, None))
    if not issubclass(kind, AppSettings):
        raise SettingError(
            f"{family.name}'s default app {module} has no `SETTINGS = ...` statement building an "
            "AppSettings (prismserve.app.AppSettings): an app module for a family keeps its parameters there"
        )
    try:
        return kind.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
            for error in exc.errors()
        )
        raise SettingError(
            f"{family.name}'s default app {module} does not take these settings: {problems} "
            f"(settings of {kind.__name__}: {', '.join(kind.model_fields)})"
        ) from None
