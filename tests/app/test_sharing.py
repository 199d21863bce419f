"""Component sharing: equivalent unit tasks are deployed once, within an app and across apps."""

from __future__ import annotations

import asyncio

import pytest
from toy.executors import EXECUTORS

from prismserve.app import AppRegistry, AppRegistryError, load_app_source
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import use_dispatcher

# 002 Listing 2: two LLMs behind one vision encoder deployment, answered side by side.
ARENA_APP = """
import asyncio
from pydantic import BaseModel
from prismserve.app import AppConfig
from toy.tasks import ChatRequest, MLLMTask

models = ["gemma-4b", "gemma-12b"]
mllms = {m: MLLMTask(model_id=m, encoder_model_id="siglip") for m in models}

class Config(AppConfig):
    tasks = mllms

class Answers(BaseModel):
    answers: dict[str, list[str]]

async def serve(request: ChatRequest) -> Answers:
    responses = await asyncio.gather(*(task(request) for task in mllms.values()))
    return Answers(answers={m: await r.text.collect() for m, r in zip(models, responses)})
"""

SOLO_APP = """
from pydantic import BaseModel
from prismserve.app import AppConfig
from toy.tasks import ChatRequest, MLLMTask

mllm = MLLMTask(model_id="gemma-4b", encoder_model_id="siglip")

class Config(AppConfig):
    tasks = {"mllm": mllm}

class Answer(BaseModel):
    tokens: list[str]

async def serve(request: ChatRequest) -> Answer:
    return Answer(tokens=await (await mllm(request)).text.collect())
"""


def kinds(deployments):
    return sorted(f"{type(d.task).__name__}({getattr(d.task, 'model_id', '')})" for d in deployments)


def test_two_llms_share_one_encoder_deployment_within_an_app():
    app = load_app_source(ARENA_APP, "arena")
    units = app.unit_tasks()
    assert sorted(f"{type(t).__name__}:{t.model_id}" for t in units.values()) == [
        "EncoderTask:siglip",
        "EncoderTask:siglip",  # image and audio
        "LLMTask:gemma-12b",
        "LLMTask:gemma-4b",
    ]


def test_sharing_app_serves_both_models_concurrently():
    app = load_app_source(ARENA_APP, "arena")

    async def scenario():
        graphs = []
        with use_dispatcher(LocalDispatcher(EXECUTORS, on_graph=graphs.append)):
            answers = await app.serve(ChatRequest.of("hi", images=[b"img"]))
        return answers, graphs

    answers, graphs = asyncio.run(scenario())
    assert set(answers.answers) == {"gemma-4b", "gemma-12b"}
    assert answers.answers["gemma-4b"] == answers.answers["gemma-12b"]  # same encoder, same embedding
    encoder_keys = {g.nodes[0].task_key for g in graphs}
    assert len(graphs) == 2 and len(encoder_keys) == 1


def test_equivalent_tasks_across_apps_share_deployments_until_the_last_app_goes():
    registry = AppRegistry()
    new = registry.register(load_app_source(ARENA_APP, "arena"))
    assert kinds(new) == [
        "EncoderTask(siglip)",
        "EncoderTask(siglip)",
        "LLMTask(gemma-12b)",
        "LLMTask(gemma-4b)",
    ]
    # The solo app needs nothing new: its encoder and LLM are equivalent to the arena's.
    assert registry.register(load_app_source(SOLO_APP, "solo")) == []
    assert len(registry.deployments) == 4
    shared = [d for d in registry.deployments.values() if d.apps == {"arena", "solo"}]
    assert kinds(shared) == ["EncoderTask(siglip)", "EncoderTask(siglip)", "LLMTask(gemma-4b)"]

    assert kinds(registry.unregister("arena")) == ["LLMTask(gemma-12b)"]
    assert len(registry.deployments) == 3
    assert kinds(registry.unregister("solo")) == [
        "EncoderTask(siglip)",
        "EncoderTask(siglip)",
        "LLMTask(gemma-4b)",
    ]
    assert registry.deployments == {}


def test_registry_refuses_duplicates_and_unknown_names():
    registry = AppRegistry()
    registry.register(load_app_source(SOLO_APP, "solo"))
    with pytest.raises(AppRegistryError, match="already registered"):
        registry.register(load_app_source(SOLO_APP, "solo"))
    with pytest.raises(AppRegistryError, match="no app named 'nope'"):
        registry.unregister("nope")
    with pytest.raises(AppRegistryError, match=r"registered: \['solo'\]"):
        registry.get("nope")
