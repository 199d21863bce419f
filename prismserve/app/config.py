"""AppConfig: what an app file declares about itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar


class AppConfig:
    """Subclass as `class Config(AppConfig)` in an app file and list its tasks by name.

    `tasks` maps a name to each task the app's serve() calls; the unit tasks reachable from them
    are what gets deployed (equivalent unit tasks are deployed once, across apps too).
    `input_modalities` (text, image, audio, video) and `output_modalities` (text, audio) say what
    a chat app accepts and produces. `sim_values` maps a unit-task class to the function that
    computes its outputs when it runs on a `sim` executor (apps without weights, such as the tests'
    toys); other `sim` outputs are synthesised from the output type.
    """

    tasks: ClassVar[dict[str, Any]] = {}
    # What chat requests may carry and ask for; the gateway refuses others with a 4xx.
    input_modalities: ClassVar[frozenset[str]] = frozenset({"text"})
    output_modalities: ClassVar[frozenset[str]] = frozenset({"text"})
    sim_values: ClassVar[dict[type, Any]] = {}
    # Apps whose executors' costs are known rather than measured (emulated models on `sim`
    # executors): `planner_spec(requests)` gives the planner's spec for a workload's requests
    # (`bench.workloads.RequestSpec`s) and `deployment_plan(plan)` the runtime plan for a planner
    # plan (deployment names, sim profiles). `prismserve profile` and `serve --gpus` use them
    # instead of measuring the app; as staticmethods. None: measured.
    planner_spec: ClassVar[Callable[[list[Any]], Any] | None] = None
    deployment_plan: ClassVar[Callable[[Any], Any] | None] = None
