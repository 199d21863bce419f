"""A plan of deployment options on an app without a Router: colocated options realised as deployments at
another GPU shape packed on one GPU, and each request's calls sent along a path sampled for its type.
In-process replicas with declared GPUs, no Ray."""

from __future__ import annotations

import asyncio

import pytest
from runtime_apps import SOLO
from test_resources import run

from prismserve.errors import InvalidRequestError, UnavailableError
from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest

E, L = "mllm.encoders.image", "mllm.llm"
PLAN = {
    "options": {"E": {E: 1}, "L": {L: 1}, "E+L": {E: 0.25, L: 0.75}},
    "cells": [{"gpus": 2, "replicas": {"E": 1, "L": 1}}, {"gpus": 1, "count": 2, "replicas": {"E+L": 1}}],
    "routing": {"image+text": {"E->L": 0.5, "E+L": 0.25, "E->E+L": 0.25}, "text": {"E+L": 1.0}},
}


def calls_by_shape(runtime, name):
    """Calls taken by the replicas of deployment `name` at each GPU shape."""
    found = {}
    for manager in runtime.managers.values():
        if type(manager.task).__name__ == name:
            found[manager.task.gpus] = found.get(manager.task.gpus, 0) + sum(
                r.calls for r in manager.replicas
            )
    return found


def test_deployment_options_are_realised_and_each_request_follows_a_sampled_path():
    async def scenario(runtime):
        app = await runtime.register_app(SOLO, "mllm")
        await runtime.deploy("mllm", Plan.model_validate(PLAN))
        cells = sorted(
            (c.gpus, c.reserved, sorted(runtime.managers[k].task.gpus for k in c.replicas))
            for c in runtime.resources.cells
        )
        for index in range(60):
            request = (
                ChatRequest.of(f"q{index}", images=[b"a"]) if index < 40 else ChatRequest.of("text only")
            )
            async with runtime.request("mllm", request.request_type):
                answer = await app.serve(request)
            assert answer.tokens[-1] in (f"q{index}", "only")
        return cells, calls_by_shape(runtime, "EncoderTask"), calls_by_shape(runtime, "LLMTask")

    cells, encoders, llms = run(scenario)
    # The colocated option: both deployments at their shares, on one GPU of its cell.
    assert cells == [(1, 1.0, [0.25, 0.75]), (1, 1.0, [0.25, 0.75]), (2, 2.0, [1.0, 1.0])]
    # 40 image requests, the plan's split kept exactly (smooth weighted round-robin): E->L (20) and
    # E->E+L (10) encode on the solo encoder, E+L (10) on its own; the LLM runs solo on E->L only;
    # the 20 text requests all go to E+L.
    assert encoders == {1.0: 30, 0.25: 10}
    assert llms == {1.0: 20, 0.75: 40}


def test_a_request_a_plan_gives_no_replica_for_is_a_503_that_says_why():
    """A plan for text only (made for a workload of text requests) gives the encoder no replica: an
    image request is a 503 naming the deployment, its type and the fix, not an executor failure,
    and text is served on."""
    text_only = {
        "options": {"L": {L: 1}},
        "cells": [{"gpus": 1, "replicas": {"L": 1}}],
        "routing": {"text": {"L": 1.0}},
    }

    async def scenario(runtime):
        app = await runtime.register_app(SOLO, "mllm")
        await runtime.deploy("mllm", Plan.model_validate(text_only))
        request = ChatRequest.of("see", images=[b"a"])
        with pytest.raises(UnavailableError) as refused:
            async with runtime.request("mllm", request.request_type):
                await app.serve(request)
        async with runtime.request("mllm", "text"):
            answer = await app.serve(ChatRequest.of("text only"))
        return refused.value, answer.tokens

    refused, tokens = run(scenario)
    assert refused.status == 503 and tokens[-1] == "only"
    assert str(refused).startswith(
        "the deployed plan gives EncoderTask no replica: requests of type 'image+text'"
    )


def test_a_plan_naming_an_option_it_does_not_define_or_an_unknown_deployment_is_refused():
    async def scenario(runtime):
        await runtime.register_app(SOLO, "mllm")
        undefined = {**PLAN, "routing": {"text": {"X": 1.0}}}
        with pytest.raises(InvalidRequestError, match=r"names options \['X'\]"):
            await runtime.deploy("mllm", Plan.model_validate(undefined))
        unknown = {**PLAN, "options": {**PLAN["options"], "E": {"mllm.vision": 1}}}
        with pytest.raises(InvalidRequestError, match=r"mllm.vision"):
            await runtime.deploy("mllm", Plan.model_validate(unknown))
        return "mllm" in runtime.plans

    assert run(scenario) is False


def test_unregistering_the_app_stops_the_deployments_its_plan_added():
    async def scenario(runtime):
        await runtime.register_app(SOLO, "mllm")
        await runtime.deploy("mllm", Plan.model_validate(PLAN))
        shapes = len(runtime.managers)
        await runtime.unregister_app("mllm")
        await asyncio.sleep(0)
        return shapes, len(runtime.managers), runtime.resources.cells

    shapes, left, cells = run(scenario)
    assert shapes == 5 and left == 0 and cells == []
