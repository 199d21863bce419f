"""App files serving an emulated model through the gateway's OpenAI API."""

from __future__ import annotations

from prismserve.emulate.catalog import MODELS

_TEMPLATE = '''"""Emulated {name}: `sim` executors along the planned paths (prismserve.emulate).

Its costs are known, so `prismserve serve --gpus N` plans it from them instead of measuring
(`Config.planner_spec`), with sim times divided by $PRISMSERVE_SIM_SPEEDUP (default 1).
"""

import os

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatCompletion, ChatRequest
from prismserve.emulate.catalog import MODELS
from prismserve.emulate.tasks import EmulatedTask, completion

SPEEDUP = float(os.environ.get("PRISMSERVE_SIM_SPEEDUP", "1"))
model = EmulatedTask(spec=MODELS[{name!r}])


class Config(AppConfig):
    tasks = {{"model": model}}
    input_modalities = frozenset({inputs!r})
    output_modalities = frozenset({outputs!r})

    @staticmethod
    def planner_spec(requests):
        return MODELS[{name!r}].served_spec(requests, SPEEDUP)

    @staticmethod
    def deployment_plan(plan):
        return MODELS[{name!r}].served_deployment(plan, SPEEDUP)


async def serve(request: ChatRequest) -> ChatCompletion:
    await model(request)
    return completion(request)
'''

_MODALITIES = {
    "qwen25-omni": ({"text", "image", "audio", "video"}, {"text", "audio"}),
    "internvl3-38b": ({"text", "image"}, {"text"}),
}


def app_source(model: str) -> str:
    """The source of an app serving emulated `model` (one of prismserve.emulate.catalog.MODELS)."""
    if model not in MODELS:
        raise KeyError(f"no emulated model {model!r}; there are {sorted(MODELS)}")
    inputs, outputs = _MODALITIES[model]
    return _TEMPLATE.format(name=model, inputs=sorted(inputs), outputs=sorted(outputs))
