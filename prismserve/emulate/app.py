"""Apps serving an emulated model through the gateway's OpenAI API: the app module
`prismserve.emulate.chat_app` with its settings written for one model of the catalog."""

from __future__ import annotations

from pydantic import field_validator

from prismserve.app.settings import AppSettings, app_module_source
from prismserve.emulate.catalog import MODELS

CHAT_APP = "prismserve.emulate.chat_app"

# What each emulated model takes and answers with (its `Config`'s modalities).
MODALITIES = {
    "qwen25-omni": (frozenset({"text", "image", "audio", "video"}), frozenset({"text", "audio"})),
    "qwen3-omni": (frozenset({"text", "image", "audio", "video"}), frozenset({"text", "audio"})),
    "internvl3-38b": (frozenset({"text", "image"}), frozenset({"text"})),
    "qwen25-vl-32b": (frozenset({"text", "image"}), frozenset({"text"})),
    "llava15-7b": (frozenset({"text", "image"}), frozenset({"text"})),
    # Served through the chat API like the others: its image is work on the sim replicas, its
    # answer a text stand-in (an app's outputs are text or audio).
    "qwen-image": (frozenset({"text"}), frozenset({"text"})),
}


_DOC = """`sim` executors along the planned paths (prismserve.emulate).

`prismserve serve --gpus N` profiles it by timing its replicas (`sim` times divided by
$PRISMSERVE_SIM_SPEEDUP, default 1); `Config.planner_spec` gives the spec's shape only."""


class EmulatedAppSettings(AppSettings):
    """`prismserve.emulate.chat_app`'s settings: which emulated model (a name in
    `prismserve.emulate.catalog.MODELS`) it serves."""

    model: str

    @field_validator("model")
    @classmethod
    def _known(cls, model: str) -> str:
        if model not in MODELS or model not in MODALITIES:
            raise ValueError(
                f"no emulated model {model!r}; there are {sorted(set(MODELS) & set(MODALITIES))}"
            )
        return model

    @property
    def input_modalities(self) -> frozenset[str]:
        """What the model's requests may carry."""
        return MODALITIES[self.model][0]

    @property
    def output_modalities(self) -> frozenset[str]:
        """What the model answers with."""
        return MODALITIES[self.model][1]


def app_source(model: str) -> str:
    """The source of an app serving emulated `model` (one of prismserve.emulate.catalog.MODELS)."""
    if model not in MODELS:
        raise KeyError(f"no emulated model {model!r}; there are {sorted(MODELS)}")
    return app_module_source(CHAT_APP, EmulatedAppSettings(model=model), doc=f"Emulated {model}: {_DOC}")
