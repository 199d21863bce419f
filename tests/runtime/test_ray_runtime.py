"""The Ray runtime end to end: cells on declared GPUs, sim executors, routing, sharing, recovery."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from runtime_apps import ARENA, GPUS_PER_NODE, ROUTED_MLLM, SHARED_GPU, SOLO
from toy.executors import VALUES, embed
from toy.tasks import MediaInput

from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.runtime.resources import PlacementError
from prismserve.runtime.task_manager import ReplicaState
from prismserve.task import DispatchError, use_dispatcher

ROUTED_PLAN = {
    "cells": [
        {
            "gpus": 2,
            "count": 1,
            "replicas": {"router.paths.EL.llm": 1, "router.paths.E->L.encoders.image": 1},
        },
        {"gpus": 1, "count": 2, "replicas": {"router.paths.E->L.llm": 1}},
    ],
    "routing": {"text": {"EL": 0.7, "E->L": 0.3}, "image+text": {"EL": 0.2, "E->L": 0.8}},
}


def run(scenario):
    """Run `scenario(runtime)` on a fresh runtime joined to the session's cluster."""

    async def main():
        runtime = RayRuntime(values=VALUES, health_interval_s=0.5)
        await runtime.start()
        try:
            # A hang fails here, with the traceback of where the scenario was waiting.
            return await asyncio.wait_for(scenario(runtime), 120)
        finally:
            await asyncio.wait_for(runtime.close(), 60)

    return asyncio.run(main())


def expected_tokens(text: str, images: list[bytes]) -> list[str]:
    checksum = sum(sum(embed(MediaInput(modality="image", data=d))) for d in images)
    return [f"[{len(images)} media, {checksum:.3f}]", "user:", *text.split()]


def test_concurrent_text_and_image_requests_follow_the_planned_paths(ray_cluster):
    async def scenario(runtime):
        app = await runtime.register_app(ROUTED_MLLM, "mllm")
        await runtime.deploy("mllm", Plan.model_validate(ROUTED_PLAN))
        graphs = []
        requests = [ChatRequest.of(f"q{i} words", images=[bytes([i % 7])] * (i % 2)) for i in range(240)]

        async def one(request):
            async with runtime.request("mllm"):  # the plan deployed for the app routes it
                return await app.serve(request)

        original = runtime.dispatcher.execute

        async def recording(graph):
            graphs.append(graph)
            return await original(graph)

        runtime.dispatcher.execute = recording
        answers = await asyncio.gather(*(one(r) for r in requests))
        return requests, answers, graphs, runtime.status()

    requests, answers, graphs, status = run(scenario)
    for request, answer in zip(requests, answers, strict=True):
        assert answer.tokens == expected_tokens(request.messages[0].text, [p.data for p in request.images])
    # Path frequencies per request type match the plan (chi-square, 1 dof, p = 1e-4: two draws per run,
    # and a plan not followed, e.g. each path half the time, gives chi-square above 20).
    by_type: dict[str, Counter] = {"text": Counter(), "image+text": Counter()}
    for graph in graphs:
        is_image = any(type(n.task).__name__ == "EncoderTask" for n in graph) or any(
            n.task.with_encoders and n.input.media for n in graph
        )
        path = "EL" if graph.nodes[-1].task.with_encoders else "E->L"
        by_type["image+text" if is_image else "text"][path] += 1
    for request_type, counts in by_type.items():
        n = sum(counts.values())
        assert n == 120
        chi2 = sum(
            (counts[p] - n * q) ** 2 / (n * q) for p, q in ROUTED_PLAN["routing"][request_type].items()
        )
        assert chi2 < 15.14, (request_type, counts)
    assert len(status["cells"]) == 3 and status["gpus"]["free"] == 2 * GPUS_PER_NODE - 4


def test_two_apps_share_one_encoder_deployment(ray_cluster):
    async def scenario(runtime):
        arena = await runtime.register_app(ARENA, "arena")
        keys_before = set(runtime.managers)
        solo = await runtime.register_app(SOLO, "solo")
        shared_cells = len(runtime.resources.cells)
        with use_dispatcher(runtime.dispatcher):
            both = await arena.serve(ChatRequest.of("hi", images=[b"img"]))
            one = await solo.serve(ChatRequest.of("hi", images=[b"img"]))
        await runtime.unregister_app("arena")
        after = set(runtime.managers)
        return keys_before, shared_cells, both, one, after, runtime

    keys, cells, both, one, after, runtime = run(scenario)
    # Two LLMs + one image and one audio encoder of "siglip": 4 deployments, 4 single-replica cells.
    assert len(keys) == 4 and cells == 4
    assert both.answers["gemma-4b"] == both.answers["gemma-12b"] == one.tokens
    # The 12b LLM was arena's alone; the encoders and the 4b LLM stay for solo.
    assert len(after) == 3 and not any("gemma-12b" in str(m) for m in after)


def test_a_started_replica_has_its_heap_out_of_the_collectors_sight(ray_cluster):
    """What a replica loaded lives as long as it does: frozen (`gc.freeze`), a full collection no
    longer walks it. Unfrozen, a loaded LLM replica's full collection took 300-490 ms, every stream
    it served standing still meanwhile (`replica.freeze_heap`)."""

    async def scenario(runtime):
        await runtime.register_app(SOLO, "solo")
        return [r.info for m in runtime.managers.values() for r in m.replicas]

    infos = run(scenario)
    assert infos and all(info["gc_frozen"] > 10_000 for info in infos)


def test_cells_never_span_nodes_and_replicas_see_their_gpus(ray_cluster):
    plan = {
        "cells": [
            {
                "gpus": GPUS_PER_NODE,
                "count": 2,
                "replicas": {"router.paths.EL.llm": 2, "router.paths.E->L.llm": 2},
            }
        ],
        "routing": {"text": {"EL": 0.5, "E->L": 0.5}},
    }

    async def scenario(runtime):
        await runtime.register_app(ROUTED_MLLM, "mllm")
        await runtime.deploy("mllm", Plan.model_validate(plan))
        return runtime.status()

    status = run(scenario)
    assert len(status["cells"]) == 2
    nodes = {c["node_id"] for c in status["cells"]}
    assert len(nodes) == 2  # each 4-GPU cell fills one node
    cell_node = {c["id"]: c["node_id"] for c in status["cells"]}
    replicas = [r for d in status["deployments"].values() for r in d["replicas"] if r["cell"] in cell_node]
    assert len(replicas) == 8
    for replica in replicas:
        assert replica["node_id"] == cell_node[replica["cell"]]
        assert len(replica["cuda_visible_devices"].split(",")) == replica["gpus"] == 1
    # Within a node, the cell's replicas got distinct GPUs.
    for node in nodes:
        gpus = [r["gpu_ids"][0] for r in replicas if r["node_id"] == node]
        assert len(set(gpus)) == GPUS_PER_NODE


def test_replicas_with_shares_of_one_cell_see_the_same_gpu_and_a_whole_one_gets_its_own(ray_cluster):
    async def scenario(runtime):
        # Another app's share taken first: Ray would put a second fractional bundle beside it.
        elsewhere = SHARED_GPU.replace("gpus=0.3", "gpus=0.6").replace('model_id="vl"', 'model_id="other"')
        await runtime.register_app(elsewhere, "elsewhere")
        app = await runtime.register_app(SHARED_GPU, "shared")
        with use_dispatcher(runtime.dispatcher):
            answer = await app.serve(ChatRequest.of("on one gpu", images=[b"img"]))
        return runtime.status(), answer

    status, answer = run(scenario)
    cells = [c for c in status["cells"] if c["owner"] == "shared"]
    replicas = {
        c["id"]: [r for d in status["deployments"].values() for r in d["replicas"] if r["cell"] == c["id"]]
        for c in cells
    }
    shared = next(rs for rs in replicas.values() if len(rs) == 3)
    (whole,) = (rs for rs in replicas.values() if len(rs) == 1)
    assert len(cells) == 2 and {c["gpus"] for c in cells} == {1}
    assert sorted(r["gpus"] for r in shared) == [0.2, 0.3, 0.5] and whole[0]["gpus"] == 1
    assert len({(r["node_id"], tuple(r["gpu_ids"])) for r in shared}) == 1 and len(shared[0]["gpu_ids"]) == 1
    assert len({r["cuda_visible_devices"] for r in shared}) == 1
    assert answer.split == answer.whole


def test_replanning_keeps_identical_cells(ray_cluster):
    async def scenario(runtime):
        await runtime.register_app(ROUTED_MLLM, "mllm")
        await runtime.deploy("mllm", Plan.model_validate(ROUTED_PLAN))
        before = {c.id: (c.gpus, c.replicas) for c in runtime.resources.cells}
        bigger = {
            **ROUTED_PLAN,
            "cells": [*ROUTED_PLAN["cells"][:1], {**ROUTED_PLAN["cells"][1], "count": 3}],
        }
        await runtime.deploy("mllm", Plan.model_validate(bigger))
        after = {c.id: (c.gpus, c.replicas) for c in runtime.resources.cells}
        return before, after

    before, after = run(scenario)
    assert set(before) < set(after) and len(after) == len(before) + 1  # one cell added, none replaced
    assert all(after[cell] == deployed for cell, deployed in before.items())


def test_plan_larger_than_the_cluster_is_refused_clearly(ray_cluster):
    plan = {"cells": [{"gpus": 8, "replicas": {"router.paths.EL.llm": 8}}]}

    async def scenario(runtime):
        await runtime.register_app(ROUTED_MLLM, "mllm")
        with pytest.raises(PlacementError, match="no node has 8 free GPUs"):
            await runtime.deploy("mllm", Plan.model_validate(plan))
        with pytest.raises(ValueError, match=r"does not have; it has"):
            await runtime.deploy(
                "mllm", Plan.model_validate({"cells": [{"gpus": 1, "replicas": {"nope": 1}}]})
            )

    run(scenario)


@pytest.mark.parametrize("kill", ["ray.kill", "SIGKILL"])
@pytest.mark.reliability
def test_killed_replica_is_restarted_and_no_other_request_is_lost(ray_cluster, kill):
    """Killed through Ray, or its worker process killed under Ray (an OOM killer, a crash)."""

    async def scenario(runtime):
        import os
        import signal

        import ray

        app = await runtime.register_app(SOLO, "solo")
        llm = next(m for m in runtime.managers.values() if type(m.task).__name__ == "LLMTask")
        await runtime.resources.create_cell("solo", 1, {llm.key: 1}, runtime.managers)  # a second LLM replica
        victim = llm.replicas[0]
        if kill == "ray.kill":
            ray.kill(victim.handle, no_restart=True)
        else:
            os.kill(victim.info["pid"], signal.SIGKILL)

        async def one(i):
            with use_dispatcher(runtime.dispatcher):
                try:
                    return (await app.serve(ChatRequest.of(f"r{i}"))).tokens
                except DispatchError as exc:
                    return exc

        results = await asyncio.gather(*(one(i) for i in range(20)))
        for _ in range(200):  # the health checker restarts the replica: poll with a deadline
            if victim.up and victim.restarts:
                break
            await asyncio.sleep(0.05)
        after = await one(99)
        return results, (victim.restarts, victim.state), after

    results, (restarts, state), after = run(scenario)
    failures = [r for r in results if isinstance(r, DispatchError)]
    for failure in failures:
        assert "LLMTask" in str(failure)
    # Requests that met the dead replica were retried on a healthy one: none lost.
    assert failures == []
    assert all(r[-1] == f"r{i}" for i, r in enumerate(results))
    assert restarts == 1 and state is ReplicaState.RUNNING  # read before the runtime closed
    assert after[-1] == "r99"


def test_large_payloads_go_replica_to_replica_through_shared_memory(ray_cluster):
    async def scenario(runtime):
        from prismserve.executors import SimProfile

        runtime.values = {}  # synthesised outputs: 1 MiB embeddings
        runtime.default_profile = SimProfile(payload_bytes=1 << 20, items=4)
        app = await runtime.register_app(SOLO, "solo")
        task = app.tasks["mllm"]
        request = ChatRequest.of("x", images=[b"a", b"b"])
        graph = task.record(request)
        outputs = await runtime.dispatcher.execute(graph)
        tokens = await outputs[-1].collect()
        embedding = outputs[0].embedding
        # The gateway holds a reference into the encoder's slab, not the payload ...
        assert not embedding.is_local and type(embedding.ref).__name__ == "ShmRef"
        assert embedding.ref.nbytes == 1 << 20
        # ... and reads it only on demand (zero-copy on this node).
        assert (await embedding.fetch()).shape == ((1 << 20) // 4,)
        return tokens

    assert run(scenario) == ["t0", "t1", "t2", "t3"]


def test_dynamic_policy_asks_replicas_and_serves_the_same_answers(ray_cluster):
    async def scenario(runtime):
        app = await runtime.register_app(SOLO, "solo")
        runtime.policy = "dynamic"
        with use_dispatcher(runtime.dispatcher):
            return await asyncio.gather(*(app.serve(ChatRequest.of(f"d{i}")) for i in range(10)))

    answers = run(scenario)
    assert [a.tokens[-1] for a in answers] == [f"d{i}" for i in range(10)]


def _manager(runtime, class_name):
    return next(m for m in runtime.managers.values() if type(m.task).__name__ == class_name)


def test_the_images_of_one_request_spread_over_the_encoder_replicas(ray_cluster):
    async def scenario(runtime):
        from prismserve.executors import SimProfile
        from prismserve.runtime.task_manager import Lease

        runtime.default_profile = SimProfile(latency_s=0.5)
        app = await runtime.register_app(SOLO, "solo")
        encoder = _manager(runtime, "EncoderTask")
        await runtime.resources.create_cell("solo", 1, {encoder.key: 1}, runtime.managers)
        busy, idle = encoder.replicas
        held = [Lease(busy), Lease(busy)]  # calls of other requests
        graph = app.tasks["mllm"].record(ChatRequest.of("x", images=[b"a", b"b", b"c", b"d"]))
        running = asyncio.get_running_loop().create_task(runtime.dispatcher.execute(graph))
        for _ in range(100):  # until the four encoder calls are out
            await asyncio.sleep(0.01)
            if encoder.queue_depth() == 6:
                break
        during = busy.in_flight, idle.in_flight
        outputs = await running
        await outputs[-1].collect()
        for lease in held:
            lease.release()
        return during, busy.in_flight, idle.in_flight

    (busy_during, idle_during), busy_after, idle_after = run(scenario)
    assert busy_during > 2 and idle_during >= 2  # not all four on the idle replica
    assert busy_during + idle_during == 6
    assert busy_after == idle_after == 0


@pytest.mark.reliability
def test_a_killed_encoder_restarts_alone_its_slab_is_reclaimed_and_the_request_is_served(ray_cluster):
    async def scenario(runtime):
        import glob

        import ray

        from prismserve.executors import SimProfile

        runtime.values = {}  # synthesised outputs: 1 MiB embeddings, held in the encoder's slab
        runtime.default_profile = SimProfile(payload_bytes=1 << 20, items=4, latency_s=0.6)
        app = await runtime.register_app(SOLO, "solo")
        encoder, llm = _manager(runtime, "EncoderTask"), _manager(runtime, "LLMTask")
        victim = encoder.replicas[0]
        slabs = f"/dev/shm/prismserve-{victim.info['pid']}-*"
        assert glob.glob(slabs)
        with use_dispatcher(runtime.dispatcher):
            serving = asyncio.get_running_loop().create_task(app.serve(ChatRequest.of("x", images=[b"a"])))
            await asyncio.sleep(0.3)  # the encoder is working on the request
            ray.kill(victim.handle, no_restart=True)
            answer = await serving
        return answer, (victim.restarts, victim.state), [r.restarts for r in llm.replicas], glob.glob(slabs)

    answer, (restarts, state), llm_restarts, left = run(scenario)
    assert answer.tokens == ["t0", "t1", "t2", "t3"]  # run again once the encoder was back
    assert restarts == 1 and state is ReplicaState.RUNNING
    assert llm_restarts == [0]  # the healthy consumer was left alone
    assert left == []  # the dead replica's 64 MiB slab is gone from /dev/shm


@pytest.mark.reliability
def test_requests_wait_for_the_only_replica_while_it_restarts(ray_cluster):
    async def scenario(runtime):
        import ray

        app = await runtime.register_app(SOLO, "solo")
        victim = _manager(runtime, "LLMTask").replicas[0]
        ray.kill(victim.handle, no_restart=True)
        for _ in range(400):  # the health checker notices and starts a new actor
            if not victim.up:
                break
            await asyncio.sleep(0.01)
        assert not victim.up
        with use_dispatcher(runtime.dispatcher):
            answers = await asyncio.gather(*(app.serve(ChatRequest.of(f"w{i}")) for i in range(4)))
        return answers, victim

    answers, victim = run(scenario)
    assert [a.tokens[-1] for a in answers] == ["w0", "w1", "w2", "w3"]
    assert victim.restarts == 1 and victim.in_flight == 0


def test_a_topology_plan_deploys_on_its_nodes_and_payloads_cross_them_over_the_replicas_sockets(ray_cluster):
    """The session's nodes are named `head` (this process's) and `worker`. A plan pinning the
    encoder to the worker and the LLM to the head deploys as planned (it was refused); the LLM
    and this process read the encoder's 1 MiB embeddings from the other node over the encoder's
    socket (they went through Ray's object store), awaited or not."""
    plan = {
        "cells": [
            {"gpus": 2, "replicas": {"mllm.encoders.image": 1, "mllm.encoders.audio": 1}, "node": "worker"},
            {"gpus": 1, "replicas": {"mllm.llm": 1}, "node": "head"},
        ]
    }

    async def scenario(runtime):
        from prismserve.executors import SimProfile
        from prismserve.runtime.dataplane import current_node_id

        runtime.values = {}  # synthesised outputs: 1 MiB embeddings
        runtime.default_profile = SimProfile(payload_bytes=1 << 20, items=4)
        app = await runtime.register_app(SOLO, "solo")
        await runtime.deploy("solo", Plan.model_validate(plan))
        graph = app.tasks["mllm"].record(ChatRequest.of("x", images=[b"a", b"b"]))
        outputs = await runtime.dispatcher.execute(graph)
        tokens = await outputs[-1].collect()
        ref = outputs[0].embedding.ref
        fetched = await outputs[0].embedding.fetch()
        blocking = await asyncio.to_thread(ref.fetch)  # a caller without an event loop
        here = current_node_id()
        return runtime.status(), tokens, ref, here, fetched, blocking

    status, tokens, ref, here, fetched, blocking = run(scenario)
    nodes = {c["node"]: c["node_id"] for c in status["cells"] if c["owner"] == "solo"}
    assert set(nodes) == {"head", "worker"} and nodes["head"] == ref_node(status, "mllm.llm")
    assert nodes["worker"] == ref_node(status, "mllm.encoders.image") == ref.node_id != here == nodes["head"]
    assert type(ref.owner).__name__ == "ReplicaAddress"  # the encoder's socket, not a Ray actor
    assert fetched.shape == blocking.shape == ((1 << 20) // 4,)
    assert (fetched == blocking).all()
    assert tokens == ["t0", "t1", "t2", "t3"]  # the LLM on the head read them too


def ref_node(status, path):
    """The node of the one replica of the app solo's deployment at `path`."""
    (replica,) = status["deployments"][status["apps"]["solo"]["deployments"][path]]["replicas"]
    return replica["node_id"]


@pytest.mark.slow
@pytest.mark.reliability
def test_losing_a_node_fails_at_most_its_requests_in_flight_and_its_cell_is_placed_again(ray_cluster):
    """A third node (`doomed`) holds the encoders' cell; it leaves the cluster while requests run.
    Requests that met it may fail, naming the replica; every other request is served; its cell is
    placed again on a node still there, and requests after the loss are all served."""
    from prismserve.runtime.pool import NODE_RESOURCE

    doomed = ray_cluster.add_node(num_cpus=1, num_gpus=2, resources={f"{NODE_RESOURCE}doomed": 1})
    ray_cluster.wait_for_nodes()
    plan = {
        "cells": [
            {"gpus": 2, "replicas": {"mllm.encoders.image": 1, "mllm.encoders.audio": 1}, "node": "doomed"},
            {"gpus": 1, "replicas": {"mllm.llm": 1}, "node": "head"},
        ]
    }

    async def scenario(runtime):
        from prismserve.executors import SimProfile

        runtime.default_profile = SimProfile(latency_s=0.3)
        app = await runtime.register_app(SOLO, "solo")
        await runtime.deploy("solo", Plan.model_validate(plan))
        lost_node = next(c.node_id for c in runtime.resources.cells if c.node == "doomed")

        async def one(i):
            with use_dispatcher(runtime.dispatcher):
                try:
                    return (await app.serve(ChatRequest.of(f"r{i}", images=[b"i"] * (i % 2)))).tokens
                except DispatchError as exc:
                    return exc

        during = [asyncio.get_running_loop().create_task(one(i)) for i in range(20)]
        await asyncio.sleep(0.1)  # in flight
        await asyncio.to_thread(ray_cluster.remove_node, doomed, allow_graceful=False)
        results = await asyncio.gather(*during)
        after = await asyncio.gather(*(one(100 + i) for i in range(10)))
        return results, after, lost_node, runtime.status()

    try:
        results, after, lost_node, status = run(scenario)
    finally:
        if doomed in ray_cluster.worker_nodes:
            ray_cluster.remove_node(doomed)
    failed = [r for r in results if isinstance(r, DispatchError)]
    assert all("EncoderTask" in str(f) for f in failed)  # only what the lost node ran
    assert all(r[-1] == f"r{i}" for i, r in enumerate(results) if not isinstance(r, DispatchError))
    assert all(not isinstance(r, DispatchError) and r[-1] == f"r{100 + i}" for i, r in enumerate(after))
    placed = {c["node_id"] for c in status["cells"] if c["owner"] == "solo"}
    assert lost_node not in placed and len(status["cells"]) == 2


@pytest.mark.reliability
def test_a_payload_larger_than_the_slab_goes_to_rays_object_store_and_the_request_is_served(ray_cluster):
    """Shared memory full: an encoder whose slab cannot hold its output puts it in Ray's object
    store instead, and the request is served as with room."""

    async def scenario(runtime):
        from prismserve.executors import SimProfile

        runtime.slab_bytes = 256 << 10  # replicas started from now on: a 256 KiB slab
        runtime.values = {}
        runtime.default_profile = SimProfile(payload_bytes=1 << 20, items=4)  # 1 MiB embeddings
        app = await runtime.register_app(SOLO, "solo")
        graph = app.tasks["mllm"].record(ChatRequest.of("x", images=[b"a", b"b"]))
        outputs = await runtime.dispatcher.execute(graph)
        embedding = outputs[0].embedding
        return await outputs[-1].collect(), type(embedding.ref).__name__, (await embedding.fetch()).nbytes

    tokens, ref, nbytes = run(scenario)
    assert tokens == ["t0", "t1", "t2", "t3"]
    assert ref == "ObjectStoreRef" and nbytes == 1 << 20
