"""The replica dispatcher on in-process replicas: fan-out, the retry policy, leases. No Ray.

Stopping an in-process replica under a call is the in-process form of a dead actor, so the fault
paths the Ray runtime takes are exercised here without a cluster.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from toy.executors import EXECUTORS, embed
from toy.tasks import MLLMTask

from prismserve.executors.spec import ExecutorSpec
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.dispatcher import ReplicaDispatcher
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.task_manager import Placement, TaskManager
from prismserve.task import use_dispatcher
from prismserve.task.context import RequestContext, RequestLedger, use_request


class Cluster:
    """Task managers of in-process replicas for the toy MLLM's encoder and LLM; counts calls."""

    def __init__(self, encoder_s: float = 0.0, llm_s: float = 0.0) -> None:
        self.calls: Counter[str] = Counter()
        self.task = MLLMTask(model_id="m")
        self.encoder_s, self.llm_s = encoder_s, llm_s
        self.managers: dict[str, TaskManager] = {}
        self.dispatcher = ReplicaDispatcher(self.managers)

    async def start(self, encoders: int = 1, llms: int = 1) -> None:
        async def encoder(task, item):
            self.calls[f"encoder:{item.data.decode()}"] += 1
            await asyncio.sleep(self.encoder_s)
            return await EXECUTORS["encoder"](task, item)

        async def llm(task, request):
            self.calls["llm"] += 1
            await asyncio.sleep(self.llm_s)
            async for token in EXECUTORS["llm"](task, request):
                yield token

        for unit, function, count in (
            (self.task.encoders["image"], encoder, encoders),
            (self.task.llm, llm, llms),
        ):
            manager = TaskManager(
                unit.deployment_key(), unit, ExecutorSpec(values=function), 0, pool=InProcessPool()
            )
            for i in range(count):
                await manager.add_replica(Placement(None, i, 0))
            self.managers[manager.key] = manager

    def manager(self, name: str) -> TaskManager:
        return next(m for m in self.managers.values() if type(m.task).__name__ == name)

    async def serve(self, text: str, images: list[bytes]) -> list[str]:
        with use_dispatcher(self.dispatcher):
            return await (await self.task(ChatRequest.of(text, images=images))).text.collect()


def tokens(text: str, images: list[bytes]) -> list[str]:
    from toy.tasks import MediaInput

    checksum = sum(sum(embed(MediaInput(modality="image", data=d))) for d in images)
    return [f"[{len(images)} media, {checksum:.3f}]", "user:", *text.split()]


def test_the_images_of_one_request_spread_over_the_encoder_replicas():
    async def scenario():
        cluster = Cluster(encoder_s=0.05)
        await cluster.start(encoders=2)
        encoder = cluster.manager("EncoderTask")
        seen = []
        original = encoder.pool.submit

        def submit(replica, calls, producers, produced):
            seen.extend([replica.id] * len(calls))
            return original(replica, calls, producers, produced)

        encoder.pool.submit = submit
        images = [b"a", b"b", b"c", b"d"]
        answer = await cluster.serve("x", images)
        return answer, seen, encoder

    answer, seen, encoder = asyncio.run(scenario())
    assert answer == tokens("x", [b"a", b"b", b"c", b"d"])
    assert sorted(Counter(seen).values()) == [2, 2]  # two images on each replica
    assert [r.in_flight for r in encoder.replicas] == [0, 0]


def test_an_encoder_stopped_under_its_call_is_restarted_alone_and_the_graph_runs_again():
    async def scenario():
        cluster = Cluster(encoder_s=0.3)
        await cluster.start()
        encoder, llm = cluster.manager("EncoderTask"), cluster.manager("LLMTask")
        serving = asyncio.get_running_loop().create_task(cluster.serve("x", [b"a"]))
        await asyncio.sleep(0.1)
        await encoder.pool.stop(encoder.replicas[0])  # the actor dies under the call
        answer = await serving
        return answer, cluster.calls, encoder.replicas[0], llm.replicas[0]

    answer, calls, encoder_replica, llm_replica = asyncio.run(scenario())
    assert answer == tokens("x", [b"a"])
    assert calls == Counter({"encoder:a": 2, "llm": 1})  # run again; the abandoned LLM call never ran
    assert encoder_replica.restarts == 1 and encoder_replica.up and encoder_replica.in_flight == 0
    assert llm_replica.restarts == 0 and llm_replica.in_flight == 0  # its input was lost, it did not die


def test_a_stream_whose_replica_dies_after_the_graph_returned_is_sent_again_alone():
    async def scenario():
        cluster = Cluster(llm_s=0.3)
        await cluster.start(llms=2)
        llm = cluster.manager("LLMTask")
        with use_dispatcher(cluster.dispatcher):
            output = await cluster.task(ChatRequest.of("hello there", images=[b"a"]))
            await asyncio.sleep(0.1)
            busy = next(r for r in llm.replicas if r.in_flight)
            await llm.pool.stop(busy)
            answer = await output.text.collect()
        return answer, cluster.calls, llm.replicas

    answer, calls, replicas = asyncio.run(scenario())
    assert answer == tokens("hello there", [b"a"])
    assert calls == Counter({"encoder:a": 1, "llm": 2})  # the encoder's output was still held: not run again
    assert sorted(r.restarts for r in replicas) == [0, 1]
    assert [r.in_flight for r in replicas] == [0, 0]


def test_leases_come_back_after_executor_errors_and_requests_keep_being_served():
    async def scenario():
        cluster = Cluster()
        await cluster.start(encoders=2)

        async def broken(task, item):
            raise RuntimeError("GPU fell off")

        encoder = cluster.manager("EncoderTask")
        good_spec = encoder.spec
        await encoder.respec(ExecutorSpec(values=broken))
        failures = []
        for i in range(4):
            try:
                await cluster.serve(f"q{i}", [b"a"])
            except Exception as exc:  # noqa: BLE001 - collected for the assertions
                failures.append(str(exc))
        await encoder.respec(good_spec)
        answer = await cluster.serve("fine", [b"a"])
        return failures, answer, encoder.replicas, cluster.manager("LLMTask").replicas

    failures, answer, encoders, llms = asyncio.run(scenario())
    assert failures == ["call #0 (EncoderTask) failed: RuntimeError: GPU fell off"] * 4  # not retried
    assert answer == tokens("fine", [b"a"])
    assert [r.in_flight for r in encoders + llms] == [0, 0, 0]


def test_a_stream_still_being_produced_when_its_request_ends_is_stopped_on_its_replica():
    """A request that ends while a replica still fills one of its streams (a client that left, a
    barge-in) stops that work when its graph is released: nobody can read the stream any more. The
    replica used to go on producing it to the end (a talker spoke its last code to nobody)."""

    async def scenario() -> str:
        ended = asyncio.Event()

        async def llm(task, request):
            try:
                yield "first"
                await asyncio.sleep(60)  # a long answer
                yield "never"
            finally:
                ended.set()

        task = MLLMTask(model_id="m")
        manager = TaskManager(
            task.llm.deployment_key(), task.llm, ExecutorSpec(values=llm), 0, pool=InProcessPool()
        )
        await manager.add_replica(Placement(None, 0, 0))
        ledger = RequestLedger()
        with (
            use_dispatcher(ReplicaDispatcher({manager.key: manager})),
            use_request(RequestContext(ledger=ledger)),
        ):
            output = await task(ChatRequest.of("hello"))
            first = await anext(aiter(output.text))
        ledger.end()  # the request ends: its graph is released on its replicas
        await asyncio.wait_for(ended.wait(), 10)
        return first

    assert asyncio.run(scenario()) == "first"
