"""Record & replay: graphs recorded from plain-Python composites, replay with real outputs."""

from __future__ import annotations

import asyncio
import random

import pytest
from composites import (
    COMPARISONS,
    CompareOutput,
    Flip,
    FormatOutput,
    Nest,
    Outer,
    PeekAtOutput,
    Refine,
    RefineRequest,
    Router,
    SideEffect,
)
from toy.executors import EXECUTORS, embed
from toy.tasks import (
    EncoderOutput,
    EncoderTask,
    LLMTask,
    MediaInput,
    MLLMTask,
    OmniTask,
    TalkerTask,
    VocoderTask,
)

from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import (
    RecordError,
    ReplayDivergenceError,
    Stream,
    TaskGraph,
    TaskUsageError,
    replayable_choice,
    use_dispatcher,
)


def run(coro):
    return asyncio.run(coro)


async def call(task, request, **kwargs):
    """Run a task on a LocalDispatcher with the toy executors; return its result and the graph."""
    graphs = []
    with use_dispatcher(LocalDispatcher(EXECUTORS, on_graph=graphs.append)):
        result = await task(request, **kwargs)
        return result, graphs[-1]


def kinds(graph: TaskGraph) -> list[str]:
    return [type(node.task).__name__ for node in graph]


# --- MLLM-like composite -------------------------------------------------------------------


def test_text_only_request_skips_the_encoder():
    graph = MLLMTask(model_id="m").record(ChatRequest.of("hi there"))
    assert kinds(graph) == ["LLMTask"]
    assert graph.edges == []


def test_each_image_is_one_encoder_call_feeding_one_llm_call():
    request = ChatRequest.of("compare", images=[b"a", b"b", b"c"])
    graph = MLLMTask(model_id="m").record(request)
    assert kinds(graph) == ["EncoderTask"] * 3 + ["LLMTask"]
    assert [(e.src, e.dst, e.data) for e in graph.edges] == [
        (0, 3, "0.embedding"),
        (1, 3, "1.embedding"),
        (2, 3, "2.embedding"),
    ]
    assert [node.input.data for node in graph.nodes[:3]] == [b"a", b"b", b"c"]


def test_replay_returns_the_streamed_result_computed_from_real_embeddings():
    async def scenario():
        request = ChatRequest.of("compare these", images=[b"a", b"b"])
        response, graph = await call(MLLMTask(model_id="m"), request)
        return await response.text.collect(), graph

    tokens, graph = run(scenario())
    checksum = sum(map(sum, [embed(MediaInput(modality="image", data=d)) for d in (b"a", b"b")]))
    assert tokens == [f"[2 media, {checksum:.3f}]", "user:", "compare", "these"]
    assert len(graph) == 3


def test_monolith_sends_raw_media_to_the_llm_and_no_encoder_calls():
    async def scenario():
        response, graph = await call(
            MLLMTask(model_id="m", encoder_fission=False), ChatRequest.of("x", images=[b"a"])
        )
        return await response.text.collect(), graph

    tokens, graph = run(scenario())
    assert kinds(graph) == ["LLMTask"]
    checksum = sum(embed(MediaInput(modality="image", data=b"a")))
    # The monolith computes the same embeddings itself: same answer as the fissioned deployment.
    assert tokens[0] == f"[1 media, {checksum:.3f}]"


def test_stream_items_arrive_before_the_stream_ends():
    """A consumer sees the first token while the producer is still generating."""
    release = asyncio.Event

    async def scenario():
        gate = release()

        async def slow_llm(task, request):
            yield "first"
            await gate.wait()
            yield "second"

        with use_dispatcher(LocalDispatcher({**EXECUTORS, "llm": slow_llm})):
            response = await MLLMTask(model_id="m")(ChatRequest.of("x"))
            stream = aiter(response.text)
            first = await anext(stream)
            gate.set()
            return first, [t async for t in stream]

    assert run(scenario()) == ("first", ["second"])


# --- Omni-like composite with a conditional branch ------------------------------------------


def test_omni_runs_talker_and_vocoder_only_for_audio_output():
    omni = OmniTask(model_id="m")
    text_only = omni.record(ChatRequest.of("hi", audios=[b"q"]))
    spoken = omni.record(ChatRequest.of("hi", audios=[b"q"], audio_out=True))
    assert kinds(text_only) == ["EncoderTask", "LLMTask"]
    assert kinds(spoken) == ["EncoderTask", "LLMTask", "TalkerTask", "VocoderTask"]
    assert [(e.src, e.dst, e.data) for e in spoken.edges] == [
        (0, 1, "0.embedding"),
        (1, 2, "1"),
        (2, 3, "2.codes"),
    ]


def test_one_token_stream_feeds_the_talker_and_the_client():
    async def scenario():
        response, _ = await call(OmniTask(model_id="m"), ChatRequest.of("say hello", audio_out=True))
        return await response.text.collect(), await response.audio.collect()

    tokens, audio = run(scenario())
    assert tokens == ["[0 media, 0.000]", "user:", "say", "hello"]
    # One chunk per token, each built from the token's length: the talker read the same stream.
    assert audio == [bytes([len(t)]) * 4 for t in tokens]


# --- nesting, loops, sharing ------------------------------------------------------------------


def test_nested_composites_record_every_unit_call_in_order():
    graph = Outer().record(ChatRequest.of("x", images=[b"a"]))
    assert kinds(graph) == ["EncoderTask", "LLMTask", "EncoderTask", "LLMTask"]
    assert graph.root == "Outer"
    assert [(e.src, e.dst) for e in graph.edges] == [(0, 1), (2, 3)]


def test_equivalent_unit_tasks_in_nested_composites_share_one_key():
    units = Outer().unit_tasks()
    # Two MLLMTasks with equal fields: 2 encoders + 1 LLM, not twice that.
    assert sorted(type(t).__name__ for t in units.values()) == ["EncoderTask", "EncoderTask", "LLMTask"]


def test_loop_trip_count_follows_the_request_and_feeds_all_earlier_outputs():
    refine = Refine()
    for rounds in (0, 1, 4):
        graph = refine.record(RefineRequest(image=b"i", rounds=rounds))
        assert kinds(graph) == ["EncoderTask", "LLMTask"] * rounds
        for r in range(rounds):
            llm = graph.nodes[2 * r + 1]
            assert llm.producers == [2 * k for k in range(r + 1)]


def test_loop_replay_resolves_every_round():
    async def scenario():
        result, graph = await call(Refine(), RefineRequest(image=b"i", rounds=3))
        return result, graph

    result, graph = run(scenario())
    expected = embed(MediaInput(modality="image", data=b"i"))
    assert [h.value for h in result.embeddings] == [expected] * 3
    assert len(graph) == 6


# --- divergence and misuse ----------------------------------------------------------------------


def test_replay_with_more_calls_than_record_names_task_and_index():
    with pytest.raises(
        ReplayDivergenceError,
        match=r"SideEffect diverged at unit-task call #2: it invoked encoder \(EncoderTask\), but record made only 2",
    ):
        run(call(SideEffect(), ChatRequest.of("x")))


def test_replay_invoking_another_task_names_both_and_the_index():
    with pytest.raises(
        ReplayDivergenceError,
        match=r"call #0: record invoked encoder \(EncoderTask\), replay invoked llm \(LLMTask\)",
    ):
        run(call(Flip(), ChatRequest.of("x")))


def test_replay_feeding_a_unit_task_from_another_producer_names_its_path_and_both_sources():
    with pytest.raises(ReplayDivergenceError) as info:
        run(call(Nest(change="producer"), ChatRequest.of("x")))
    assert str(info.value).startswith(
        "replay of Nest diverged at unit-task call #2: thinker.llm (LLMTask) got input.embeddings[0] from call #1, "
        "where record had output '0.embedding' of call #0. invoke() must take the same path with the same inputs"
    )


def test_replay_feeding_a_unit_task_another_input_names_its_path_and_the_field():
    with pytest.raises(
        ReplayDivergenceError, match=r"call #2: thinker\.llm \(LLMTask\) got a different input\.prompt than"
    ):
        run(call(Nest(change="prompt"), ChatRequest.of("x")))


def test_replay_input_check_accepts_copies_of_plain_outputs_and_rewrapped_handles():
    # The talker gets the LLM's stream, the vocoder the talker's codes: both pass on replay.
    result, graph = run(call(OmniTask(model_id="m"), ChatRequest.of("hi", audio_out=True)))
    assert kinds(graph) == ["LLMTask", "TalkerTask", "VocoderTask"]
    refine = Refine()
    graph = refine.record(RefineRequest(image=b"i", rounds=1))
    refine.replay(RefineRequest(image=b"i", rounds=1), graph, [EncoderOutput(embedding=[1.0]), Stream()])


def test_replay_with_fewer_calls_than_record_is_detected():
    refine = Refine()
    graph = refine.record(RefineRequest(image=b"i", rounds=2))
    outputs = [EncoderOutput(embedding=[1.0]), Stream()] * 2
    with pytest.raises(
        ReplayDivergenceError,
        match=r"call #2: record invoked encoder \(EncoderTask\) there, replay made only 2",
    ):
        refine.replay(RefineRequest(image=b"i", rounds=1), graph, outputs)


def test_branching_on_a_placeholder_is_a_clear_error():
    with pytest.raises(RecordError, match=r"used while recording.*serve\(\)"):
        PeekAtOutput().record(ChatRequest.of("x"))


def test_formatting_a_placeholder_is_a_clear_error():
    with pytest.raises(RecordError, match=r"'0.embedding' was used while recording"):
        FormatOutput().record(ChatRequest.of("x"))


@pytest.mark.parametrize("of", ["embedding", "text"])
@pytest.mark.parametrize("op", sorted(COMPARISONS))
def test_comparing_or_hashing_a_placeholder_is_a_clear_error(op, of):
    with pytest.raises(
        RecordError,
        match=r"'\d(\.embedding)?' was (compared|hashed|searched).* does not exist yet.*replayable_choice",
    ):
        CompareOutput(op=op, of=of).record(ChatRequest.of("x"))


def test_unit_invoke_outside_record_and_replay_says_how_to_call_it():
    with pytest.raises(TaskUsageError, match=r"await task\(input\)"):
        EncoderTask(model_id="m", modality="image").invoke(MediaInput(modality="image", data=b"x"))


def test_calling_a_task_without_dispatcher_says_how_to_set_one():
    with pytest.raises(TaskUsageError, match=r"use_dispatcher"):
        run(MLLMTask(model_id="m")(ChatRequest.of("x")))


def test_request_dict_is_validated_into_the_input_type():
    async def scenario():
        request = ChatRequest.of("a b", max_tokens=2).model_dump()
        response, _ = await call(MLLMTask(model_id="m"), request)
        return await response.text.collect()

    assert run(scenario()) == ["[0 media, 0.000]", "user:"]
    with pytest.raises(ValueError, match="max_tokens"):
        run(call(MLLMTask(model_id="m"), ChatRequest.of("a").model_dump() | {"max_tokens": 0}))


# --- replayable_choice ------------------------------------------------------------------------


def _router(text_probs=(1.0, 0.0, 0.0), image_probs=(0.5, 0.3, 0.2)):
    paths = [MLLMTask(model_id="m", encoder_fission=False), MLLMTask(model_id="m"), MLLMTask(model_id="m2")]
    return Router(
        paths=paths, text_only_probabilities=list(text_probs), image_text_probabilities=list(image_probs)
    )


def test_replayable_choice_repeats_the_recorded_path_on_replay():
    router = _router(image_probs=(0.0, 0.5, 0.5))
    request = ChatRequest.of("x", images=[b"a"])
    rng = random.Random(7)
    seen = set()
    for _ in range(50):
        graph = router.record(request, rng=rng)
        path = graph.choices[0]
        seen.add(path)
        model = graph.nodes[-1].task.model_id
        assert model == ("m" if path == 1 else "m2")
        assert kinds(graph) == ["EncoderTask", "LLMTask"]
        # Replay picks the same path: the same unit tasks, whatever a new draw would say.
        outputs = [EncoderOutput(embedding=[1.0]), Stream()]
        assert router.replay(request, graph, outputs).text is outputs[1]
    assert seen == {1, 2}


def test_replayable_choice_end_to_end_uses_the_recorded_choice():
    async def scenario():
        router = _router(image_probs=(0.0, 0.0, 1.0))
        _, graph = await call(router, ChatRequest.of("x", images=[b"a"]))
        return graph

    graph = run(scenario())
    assert graph.choices == [2]
    assert graph.nodes[-1].task.model_id == "m2"


def test_replayable_choice_distribution_matches_probabilities():
    router = _router()
    request = ChatRequest.of("x", images=[b"a"])
    rng = random.Random(20261122)
    n = 10_000
    counts = [0, 0, 0]
    for _ in range(n):
        counts[router.record(request, rng=rng).choices[0]] += 1
    probs = (0.5, 0.3, 0.2)
    chi2 = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs, strict=True))
    assert chi2 < 13.82, counts  # chi-square, 2 degrees of freedom, p = 0.001
    assert [router.record(ChatRequest.of("t"), rng=rng).choices[0] for _ in range(100)] == [0] * 100


def test_replayable_choice_rejects_bad_probabilities_and_use_outside_tasks():
    with pytest.raises(ValueError, match="sum to 1"):
        _router(image_probs=(0.5, 0.3, 0.3)).record(ChatRequest.of("x", images=[b"a"]))
    with pytest.raises(ValueError, match="3 probabilities for n=2"):
        Router(
            paths=[MLLMTask(model_id="m")] * 2, text_only_probabilities=[1, 0, 0], image_text_probabilities=[]
        ).record(ChatRequest.of("x"))
    with pytest.raises(TaskUsageError, match="inside a task's invoke"):
        replayable_choice(2)


def test_a_recorded_choice_missing_on_replay_is_divergence():
    router = _router()
    request = ChatRequest.of("t")
    graph = router.record(request)
    graph.choices.clear()
    with pytest.raises(ReplayDivergenceError, match=r"replayable_choice\(\) #0"):
        router.replay(request, graph, [None])


# --- deployment keys ----------------------------------------------------------------------------


def test_equivalence_is_same_class_and_same_field_values():
    a = EncoderTask(model_id="m", modality="image")
    assert a.deployment_key() == EncoderTask(model_id="m", modality="image").deployment_key()
    assert a.deployment_key() != EncoderTask(model_id="m", modality="audio").deployment_key()
    # Same fields, different class: different deployments.
    assert TalkerTask(model_id="m").deployment_key() != VocoderTask(model_id="m").deployment_key()
    assert (
        LLMTask(model_id="m").deployment_key() != LLMTask(model_id="m", with_encoders=True).deployment_key()
    )


def test_deployment_key_is_stable_across_processes():
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "from toy.tasks import EncoderTask;"
        "print(EncoderTask(model_id='m', modality='image').deployment_key())"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}  # tests/: where `toy` is
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    assert other == EncoderTask(modality="image", model_id="m").deployment_key()


def test_unit_tasks_are_immutable_so_keys_cannot_go_stale():
    task = EncoderTask(model_id="m", modality="image")
    with pytest.raises(ValueError, match="frozen"):
        task.model_id = "other"


def test_a_served_apps_divergence_names_the_unit_task_by_its_path_in_the_app():
    from toy.executors import EXECUTORS

    from prismserve.runtime import LocalRuntime

    source = """
from pydantic import BaseModel
from composites import SwapOnReplay
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest

swap = SwapOnReplay()

class Config(AppConfig):
    tasks = {"omni": swap}
    input_modalities = frozenset({"text"})

class Answer(BaseModel):
    tokens: list[str]

async def serve(request: ChatRequest) -> Answer:
    return Answer(tokens=await (await swap(request)).text.collect())
"""

    async def scenario():
        runtime = LocalRuntime(EXECUTORS)
        app = await runtime.register_app(source, "chat")
        async with runtime.request("chat"):
            await app.serve(ChatRequest.of("x"))

    with pytest.raises(
        ReplayDivergenceError, match=r"omni\.llm \(LLMTask\) got input\.embeddings\[0\] from call #1"
    ):
        asyncio.run(scenario())
