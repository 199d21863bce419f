"""LocalDispatcher: concurrency of independent calls, dependencies, failures."""

from __future__ import annotations

import asyncio
import threading

import pytest
from toy.executors import EXECUTORS
from toy.tasks import EncoderOutput, MLLMTask

from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import DispatchError, use_dispatcher


def run(coro):
    return asyncio.run(coro)


def test_independent_encoder_calls_run_concurrently():
    """Three encoder calls meet at a barrier: that only completes if all three run at once."""

    async def scenario():
        barrier = asyncio.Barrier(3)

        async def encoder(task, item):
            await asyncio.wait_for(barrier.wait(), timeout=5)
            return EncoderOutput(embedding=[1.0])

        with use_dispatcher(LocalDispatcher({**EXECUTORS, "encoder": encoder})):
            response = await MLLMTask(model_id="m")(ChatRequest.of("x", images=[b"a", b"b", b"c"]))
            return await response.text.collect()

    assert run(scenario())[0] == "[3 media, 3.000]"


def test_plain_function_executors_run_off_the_event_loop_and_concurrently():
    barrier = threading.Barrier(2, timeout=5)

    def encoder(task, item):
        barrier.wait()  # deadlocks unless both calls run at once, in different threads
        return {"embedding": [0.5]}

    async def scenario():
        with use_dispatcher(LocalDispatcher({**EXECUTORS, "encoder": encoder})):
            response = await MLLMTask(model_id="m")(ChatRequest.of("x", images=[b"a", b"b"]))
            return await response.text.collect()

    assert run(scenario())[0] == "[2 media, 1.000]"


def test_consumer_waits_for_its_producers():
    order = []

    async def scenario():
        async def encoder(task, item):
            await asyncio.sleep(0.01)
            order.append("encoder")
            return EncoderOutput(embedding=[0.0])

        async def llm(task, request):
            order.append("llm")
            yield "done"

        with use_dispatcher(LocalDispatcher({**EXECUTORS, "encoder": encoder, "llm": llm})):
            response = await MLLMTask(model_id="m")(ChatRequest.of("x", images=[b"a", b"b"]))
            return await response.text.collect()

    assert run(scenario()) == ["done"]
    assert order == ["encoder", "encoder", "llm"]


def test_failing_executor_fails_the_request_naming_the_call():
    async def scenario():
        async def encoder(task, item):
            raise RuntimeError("GPU fell off")

        with use_dispatcher(LocalDispatcher({**EXECUTORS, "encoder": encoder})):
            await MLLMTask(model_id="m")(ChatRequest.of("x", images=[b"a"]))

    with pytest.raises(DispatchError, match=r"call #0 \(EncoderTask\) failed: RuntimeError: GPU fell off"):
        run(scenario())


def test_error_inside_a_stream_reaches_its_consumer():
    async def scenario():
        async def llm(task, request):
            yield "partial"
            raise RuntimeError("decode step crashed")

        with use_dispatcher(LocalDispatcher({**EXECUTORS, "llm": llm})):
            response = await MLLMTask(model_id="m")(ChatRequest.of("x"))
            received = []
            # Named as the Ray runtime names it: the call, its task, the error.
            with pytest.raises(
                DispatchError, match=r"call #0 \(LLMTask\) failed: RuntimeError: decode step crashed"
            ):
                async for token in response.text:
                    received.append(token)
            return received

    assert run(scenario()) == ["partial"]


def test_missing_executor_kind_is_reported_before_anything_runs():
    calls = []

    async def scenario():
        async def encoder(task, item):
            calls.append(item)
            return EncoderOutput(embedding=[0.0])

        with use_dispatcher(LocalDispatcher({"encoder": encoder})):
            await MLLMTask(model_id="m")(ChatRequest.of("x", images=[b"a"]))

    with pytest.raises(
        DispatchError,
        match=r"no executor function is registered for kind 'llm' \(registered: \['encoder'\]\)",
    ):
        run(scenario())
    assert calls == []


def test_executor_output_is_validated_against_the_output_type():
    async def scenario():
        async def encoder(task, item):
            return {"wrong_field": 1}

        with use_dispatcher(LocalDispatcher({**EXECUTORS, "encoder": encoder})):
            await MLLMTask(model_id="m")(ChatRequest.of("x", images=[b"a"]))

    with pytest.raises(DispatchError, match=r"(?s)EncoderTask.*embedding"):
        run(scenario())
