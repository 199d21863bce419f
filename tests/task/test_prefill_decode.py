"""MLLMTask and OmniTask with prefill and decode split (TriInfer's P and D): what they record and deploy."""

from __future__ import annotations

import pytest

from prismserve.protocol.chat import ChatRequest
from prismserve.task import TaskDefinitionError
from prismserve.tasklib import MLLMTask, OmniTask
from prismserve.tasklib.units import (
    DecodeInput,
    EncoderTask,
    TalkerTask,
    VLLMDecodeTask,
    VLLMPrefillTask,
    VLLMThinkerDecodeTask,
    VLLMThinkerPrefillTask,
    VocoderTask,
)


def test_the_llm_is_recorded_as_prefill_then_decode_fed_by_prefills_handoff():
    task = MLLMTask(model="m", engine="vllm", prefill_decode=True)
    graph = task.record(ChatRequest.of("what is this?", images=[b"png"]))
    encoder, prefill, decode = graph.nodes
    assert [type(n.task) for n in graph.nodes] == [EncoderTask, VLLMPrefillTask, VLLMDecodeTask]
    assert set(prefill.deps.values()) == {encoder.index}  # the image's embeddings
    assert isinstance(decode.input, DecodeInput)
    handoff = {f"{prefill.index}.{name}" for name in ("token", "logprobs", "finish_reason", "prompt_tokens")}
    assert {data for data, src in decode.deps.items() if src == prefill.index} == handoff
    assert {data for data, src in decode.deps.items() if src == encoder.index}  # the same embeddings


def test_prefill_and_decode_share_a_handoff_directory_made_for_their_engine_settings():
    one = MLLMTask(model="m", engine="vllm", prefill_decode=True, vllm={"dtype": "float32"})
    other = MLLMTask(model="m", engine="vllm", prefill_decode=True, vllm={"dtype": "bfloat16"})
    assert one.prefill.handoff_dir == one.decode.handoff_dir
    assert one.prefill.handoff_dir != other.prefill.handoff_dir  # a KV cache fits only its own engine
    chosen = MLLMTask(model="m", engine="vllm", prefill_decode=True, vllm={"handoff_dir": "/shared/kv"})
    assert chosen.prefill.handoff_dir == chosen.decode.handoff_dir == "/shared/kv"


def test_prefill_and_decode_take_gpus_of_their_own():
    task = MLLMTask(model="m", engine="vllm", prefill_decode=True, gpus={"prefill": 1, "decode": 2})
    assert (task.prefill.gpus, task.decode.gpus) == (1, 2)
    with pytest.raises(TaskDefinitionError, match=r"'llm', not a component .* 'prefill', 'decode'"):
        MLLMTask(model="m", engine="vllm", prefill_decode=True, gpus={"llm": 1})


def test_prefill_decode_needs_the_vllm_engine():
    with pytest.raises(
        TaskDefinitionError, match=r"prefill_decode=True\) splits a vLLM engine .* engine='vllm'"
    ):
        MLLMTask(model="m", prefill_decode=True)


def test_an_omni_thinker_is_recorded_as_prefill_then_decode_feeding_the_talker():
    task = OmniTask(model="m", engine="vllm", prefill_decode=True, gpus={"prefill": 0.5, "decode": 0.5})
    graph = task.record(ChatRequest.of("say what this is", images=[b"png"], audio_out=True))
    kinds = [type(n.task) for n in graph.nodes]
    assert kinds == [EncoderTask, VLLMThinkerPrefillTask, VLLMThinkerDecodeTask, TalkerTask, VocoderTask]
    _, prefill, decode, talker, _ = graph.nodes
    assert {src for src in decode.deps.values()} >= {prefill.index}
    assert set(talker.deps.values()) == {decode.index}  # the conditioning comes from decode alone
    assert decode.input.speech and (task.prefill.gpus, task.decode.gpus) == (0.5, 0.5)
    assert task.prefill.handoff_dir == task.decode.handoff_dir


@pytest.mark.parametrize("settings", [{}, {"engine": "vllm", "monolith": True}])
def test_an_omni_prefill_decode_split_needs_the_split_vllm_thinker(settings):
    with pytest.raises(TaskDefinitionError, match=r"prefill_decode=True\) splits the thinker's vLLM engine"):
        OmniTask(model="m", prefill_decode=True, **settings)
