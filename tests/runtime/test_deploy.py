"""Deploying a plan: the planner's Plan, checked against the app; its routing reaches the app's routers
through context, and no task object changes."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from runtime_apps import LLM, ROUTED_MLLM, SIM_MLLM
from toy.executors import EXECUTORS

from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime import LocalRuntime
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import use_dispatcher

ONLY_EL = {"cells": [], "routing": {"text": {"EL": 1.0}}}


def paths_taken(runtime: LocalRuntime, app_name: str, requests: int = 40, scoped: bool = True) -> Counter:
    """How many requests took each path (EL runs the LLM with its own encoders)."""
    taken: Counter = Counter()
    dispatcher = LocalDispatcher(
        EXECUTORS, on_graph=lambda g: taken.update(["EL" if g.nodes[-1].task.with_encoders else "E->L"])
    )
    app = runtime.registry.get(app_name)

    async def serve_all():
        for i in range(requests):
            if scoped:
                async with runtime.request(app_name):
                    with use_dispatcher(dispatcher):  # inside: the runtime's request sets its own
                        await app.serve(ChatRequest.of(f"q{i}"))
            else:
                with use_dispatcher(dispatcher):
                    await app.serve(ChatRequest.of(f"q{i}"))

    asyncio.run(serve_all())
    return taken


def test_the_plan_routes_its_app_only_inside_its_requests():
    runtime = LocalRuntime(EXECUTORS)
    asyncio.run(runtime.register_app(ROUTED_MLLM, "planned"))
    asyncio.run(runtime.register_app(ROUTED_MLLM, "unplanned"))
    asyncio.run(runtime.deploy("planned", Plan.model_validate(ONLY_EL)))

    assert paths_taken(runtime, "planned") == Counter({"EL": 40})
    # The same app's routers outside a request of the runtime, and another app, keep their own (even) split.
    assert set(paths_taken(runtime, "planned", scoped=False)) == {"EL", "E->L"}
    assert set(paths_taken(runtime, "unplanned")) == {"EL", "E->L"}
    router = runtime.registry.get("planned").tasks["router"]
    assert router.routing == {}  # the deployment changed no task object


def test_a_plan_naming_a_path_the_router_lacks_is_refused():
    runtime = LocalRuntime(EXECUTORS)
    asyncio.run(runtime.register_app(ROUTED_MLLM, "planned"))
    bad = Plan.model_validate({"cells": [], "routing": {"text": {"E->L->G": 1.0}}})
    with pytest.raises(ValueError, match=r"names paths \['E->L->G'\]"):
        asyncio.run(runtime.deploy("planned", bad))


def test_a_plan_with_an_invalid_sim_profile_is_refused_naming_the_deployment():
    runtime = LocalRuntime(EXECUTORS)
    asyncio.run(runtime.register_app(ROUTED_MLLM, "planned"))
    bad = Plan.model_validate({"cells": [], "profiles": {"router.paths.EL.llm": {"latency_s": -1}}})
    with pytest.raises(
        ValueError, match=r"profiles\['router.paths.EL.llm'\] is not a sim profile.*latency_s"
    ):
        asyncio.run(runtime.deploy("planned", bad))
    assert "planned" not in runtime.plans


def test_the_planners_json_is_the_plan_the_runtime_deploys():
    from prismserve.planner import Plan as PlannerPlan

    printed = {
        "gpus": 1,
        "throughput": 2.5,
        "cells": [{"gpus": 1, "throughput": 2.5, "count": 1, "replicas": {"router.paths.EL.llm": 1}}],
        "routing": {"text": {"EL": 1.0}},
    }
    plan = PlannerPlan.model_validate(printed)
    assert plan.to_json_dict() == printed  # no runtime-only fields appear in the planner's output
    runtime = LocalRuntime(EXECUTORS)
    asyncio.run(runtime.register_app(ROUTED_MLLM, "planned"))
    asyncio.run(runtime.deploy("planned", plan))
    assert runtime.plans["planned"] is plan


def test_a_plan_pinning_cells_to_nodes_is_refused_not_ignored():
    runtime = LocalRuntime(EXECUTORS)
    asyncio.run(runtime.register_app(ROUTED_MLLM, "planned"))
    pinned = Plan.model_validate(
        {"cells": [{"gpus": 1, "replicas": {"router.paths.EL.llm": 1}, "node": "n1"}]}
    )
    with pytest.raises(ValueError, match=r"pins cells to nodes \['n1'\].*drop `node`"):
        asyncio.run(runtime.deploy("planned", pinned))
    assert "planned" not in runtime.plans


def test_a_profile_for_a_real_model_is_refused_unless_the_plan_emulates_it_by_name():
    """A plan's `profiles` replace a deployment's executor by a `sim` one: for a task that names a
    real engine, only where `emulate` names it (they silently turned real models into fakes)."""
    from prismserve.models import tiny

    source = SIM_MLLM.format(config="").replace('"toy-vl"', repr(str(tiny.build("qwen2.5-vl"))))
    source = source.replace("SimEncoder(model", "EncoderTask(model").replace("SimLLM(model", "LLMTask(model")
    runtime = LocalRuntime({})
    asyncio.run(runtime.register_app(source, "real"))
    profile = {"latency_s": 0.01}
    with pytest.raises(ValueError, match=r"profiles \['model.llm'\] would replace real models.*`emulate`"):
        asyncio.run(runtime.deploy("real", Plan(cells=[], profiles={LLM: profile})))
    assert "real" not in runtime.plans
    with pytest.raises(ValueError, match=r"`emulate` names \['model.llm'\] without a profile"):
        asyncio.run(runtime.deploy("real", Plan(cells=[], emulate=[LLM])))
    asyncio.run(runtime.deploy("real", Plan(cells=[], profiles={LLM: profile}, emulate=[LLM])))
    assert runtime.plans["real"].emulate == [LLM]
