"""An emulated model's chat app: `sim` executors along the planned paths (prismserve.emulate).

`prismserve serve --gpus N` profiles it as any model, by timing its replicas (`sim` times divided
by $PRISMSERVE_SIM_SPEEDUP, default 1); `Config.planner_spec` gives only the spec's shape, the
options and paths that recording cannot reveal (`prismserve.profile.shaped`).
`prismserve.emulate.app.app_source(name)` writes it for one model of the catalog.
"""

import os
from typing import Any

from prismserve.app import AppConfig
from prismserve.emulate.app import EmulatedAppSettings
from prismserve.emulate.catalog import MODELS
from prismserve.emulate.tasks import EmulatedTask, completion
from prismserve.protocol.chat import ChatCompletion, ChatRequest

# The app's parameters, in one statement (`app_source(name)` writes it for an emulated model).
SETTINGS = EmulatedAppSettings(
    model="qwen25-omni",
)

SPEEDUP = float(os.environ.get("PRISMSERVE_SIM_SPEEDUP", "1"))
EMULATED = MODELS[SETTINGS.model]
model = EmulatedTask(spec=EMULATED)


def served_spec(requests: list[Any]) -> Any:
    """The planner's spec for a workload's requests, computed from the model's known costs: its
    shape is what the profiler measures (its numbers are replaced by measured ones)."""
    return EMULATED.served_spec(requests, SPEEDUP)


def served_deployment(plan: Any) -> Any:
    """The runtime plan (deployment names, sim profiles) for a planner plan."""
    return EMULATED.served_deployment(plan, SPEEDUP)


class Config(AppConfig):
    tasks = {"model": model}
    input_modalities = SETTINGS.input_modalities
    output_modalities = SETTINGS.output_modalities
    context_length = 32768  # the emulated checkpoints' (Qwen2.5's)
    # Plain functions: read on the class, they are not bound to it (AppConfig types them as callables).
    planner_spec = served_spec
    deployment_plan = served_deployment


async def serve(request: ChatRequest) -> ChatCompletion:
    await model(request)
    return completion(request)
