"""TaskGraph serialises to JSON and back, and a graph read back runs like the original."""

from __future__ import annotations

import asyncio
import json

import pytest
from toy.executors import EXECUTORS
from toy.tasks import OmniTask

from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import TaskError, TaskGraph


def _spoken_request() -> ChatRequest:
    return ChatRequest.of("describe and say it", images=[b"\x00\xffpng"], audios=[b"RIFF"], audio_out=True)


def test_round_trip_keeps_nodes_inputs_edges_and_choices():
    graph = OmniTask(model_id="m").record(_spoken_request())
    graph.choices.append(1)
    text = graph.to_json()
    back = TaskGraph.from_json(text)
    assert back.to_dict() == graph.to_dict() == json.loads(text)
    assert [type(n.task) for n in back] == [type(n.task) for n in graph]
    assert [n.task_key for n in back] == [n.task_key for n in graph]
    assert back.edges == graph.edges
    assert back.choices == [1]
    # Binary request data survives the trip.
    assert back.nodes[0].input.data == b"\x00\xffpng"


def test_json_names_placeholders_by_producer_and_field():
    doc = OmniTask(model_id="m").record(_spoken_request()).to_dict()
    llm = doc["nodes"][2]
    assert llm["executor_kind"] == "llm"
    assert llm["input"]["embeddings"] == [{"$data": "0.embedding"}, {"$data": "1.embedding"}]
    assert doc["nodes"][3]["input"] == {"text": {"$stream": "2"}}
    assert {"src": 3, "dst": 4, "data": "3.codes"} in doc["edges"]


def test_graph_read_back_executes_and_replays_to_the_same_answer():
    async def scenario():
        omni = OmniTask(model_id="m")
        request = _spoken_request()
        dispatcher = LocalDispatcher(EXECUTORS)
        original = omni.record(request)
        direct = omni.replay(request, original, await dispatcher.execute(original))
        copy = TaskGraph.from_json(original.to_json())
        via_json = omni.replay(request, copy, await dispatcher.execute(copy))
        return (
            (await direct.text.collect(), await direct.audio.collect()),
            (await via_json.text.collect(), await via_json.audio.collect()),
        )

    direct, via_json = asyncio.run(scenario())
    assert direct == via_json
    assert len(direct[0]) == 6 and len(direct[1]) == 6


def test_changed_task_class_is_reported():
    doc = OmniTask(model_id="m").record(ChatRequest.of("x")).to_dict()
    doc["nodes"][0]["task"]["key"] = "toy.tasks.LLMTask:0000"
    with pytest.raises(TaskError, match="node 0: .* the class has changed"):
        TaskGraph.from_dict(doc)
    with pytest.raises(TaskError, match="format version"):
        TaskGraph.from_dict({**doc, "version": 99})
