"""Cells, plans and GPUs of the runtime on in-process replicas with declared GPUs. No Ray."""

from __future__ import annotations

import asyncio

import pytest
from runtime_apps import ROUTED_MLLM, SHARED_GPU, SOLO
from toy.executors import VALUES

from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.runtime.resources import PlacementError, cell_bundles, check_fits
from prismserve.task import use_dispatcher

ROUTED_PLAN = {
    "cells": [
        {
            "gpus": 2,
            "count": 1,
            "replicas": {"router.paths.EL.llm": 1, "router.paths.E->L.encoders.image": 1},
        },
        {"gpus": 1, "count": 2, "replicas": {"router.paths.E->L.llm": 1}},
    ],
    "routing": {"text": {"EL": 0.5, "E->L": 0.5}, "image+text": {"EL": 0.5, "E->L": 0.5}},
}


def run(scenario, gpus=None):
    async def main():
        runtime = RayRuntime(values=VALUES, pool=InProcessPool(gpus or {"a": 4, "b": 4}))
        await runtime.start()
        try:
            return await asyncio.wait_for(scenario(runtime), 60)
        finally:
            await runtime.close()

    return asyncio.run(main())


def cells_of(runtime):
    return {c.id: (c.node_id, c.gpus, tuple(sorted(c.replicas.items()))) for c in runtime.resources.cells}


def test_a_new_plan_keeps_identical_cells_and_changes_only_the_rest():
    async def scenario(runtime):
        app = await runtime.register_app(ROUTED_MLLM, "mllm")
        await runtime.deploy("mllm", Plan.model_validate(ROUTED_PLAN))
        first = cells_of(runtime)
        bigger = {**ROUTED_PLAN, "cells": [ROUTED_PLAN["cells"][0], {**ROUTED_PLAN["cells"][1], "count": 3}]}
        await runtime.deploy("mllm", Plan.model_validate(bigger))
        second = cells_of(runtime)
        only_el = {"cells": ROUTED_PLAN["cells"][:1], "routing": {"text": {"EL": 1.0}}}  # E->L's LLM cells go
        await runtime.deploy("mllm", Plan.model_validate(only_el))
        third = cells_of(runtime)
        async with runtime.request("mllm"):
            answer = await app.serve(ChatRequest.of("still served"))
        return first, second, third, runtime.resources.free_gpus(), answer

    first, second, third, free, answer = run(scenario)
    assert len(first) == 3 and all(second[c] == first[c] for c in first) and len(second) == 4
    (kept,) = third  # the 2-GPU cell stayed up through both changes
    assert kept in first and third[kept][1] == 2
    assert sum(free.values()) == 8 - 2
    assert answer.tokens[-2:] == ["still", "served"]


def test_cells_are_packed_on_one_node_and_a_cell_larger_than_any_node_is_refused():
    async def scenario(runtime):
        await runtime.register_app(SOLO, "solo")
        encoder = next(k for k, m in runtime.managers.items() if type(m.task).__name__ == "EncoderTask")
        cells = [
            await runtime.resources.create_cell("solo", 3, {encoder: 3}, runtime.managers) for _ in range(2)
        ]
        with pytest.raises(PlacementError, match=r"no node has 3 free GPUs .*\[0, 0\]"):
            await runtime.resources.create_cell("solo", 3, {encoder: 3}, runtime.managers)
        return [c.node_id for c in cells], runtime.resources.free_gpus()

    # The app's three 1-GPU cells (image and audio encoders, LLM) fill half of node a.
    nodes, free = run(scenario, gpus={"a": 6, "b": 3})
    assert sorted(nodes) == ["a", "b"]  # 3 free GPUs on each node, not one 3-GPU cell split over both
    assert free == {"a": 0, "b": 0}


def test_deployments_with_shares_of_a_gpu_register_into_one_gpu_cell_and_whole_ones_get_their_own():
    async def scenario(runtime):
        app = await runtime.register_app(SHARED_GPU, "shared")
        with use_dispatcher(runtime.dispatcher):
            answer = await app.serve(ChatRequest.of("both ways", images=[b"img"]))
        shapes = {
            c.id: sorted(runtime.managers[k].task.gpus for k in c.replicas) for c in runtime.resources.cells
        }
        return shapes, {c.id: c.gpus for c in runtime.resources.cells}, runtime.resources.free_gpus(), answer

    shapes, sizes, free, answer = run(scenario, gpus={"a": 4})
    assert sorted(shapes.values()) == [[0.2, 0.3, 0.5], [1.0]]
    assert set(sizes.values()) == {1} and free == {"a": 2}
    assert answer.split == answer.whole  # both paths served


def test_a_plan_cell_whose_shares_exceed_its_gpus_is_refused_naming_the_need():
    async def scenario(runtime):
        await runtime.register_app(SHARED_GPU, "shared")
        crowded = {"cells": [{"gpus": 1, "replicas": {"shared.llm": 2, "shared.encoders.image": 1}}]}
        with pytest.raises(PlacementError, match=r"a cell of 1 GPUs cannot hold replicas needing 1.3 GPUs"):
            await runtime.deploy("shared", Plan.model_validate(crowded))
        return len(runtime.resources.cells)

    assert run(scenario, gpus={"a": 4}) == 2  # the registered cells stay; nothing of the plan's is left


def test_shares_pack_first_fit_decreasing_into_bundles_of_one_gpu_beside_whole_replicas():
    bundles, index = cell_bundles([0.2, 2, 0.5, 0, 0.3, 0.6])
    assert bundles == [{"GPU": 2}, {"CPU": 0.001}, {"GPU": 1.0}, {"GPU": 1.0}]
    # 0.6 opens a GPU, 0.5 another, 0.3 fits beside 0.6, 0.2 beside 0.5.
    assert index == [3, 0, 3, 1, 2, 2]
    assert len(cell_bundles([0.6, 0.6, 0.6])[0]) == 3  # 1.8 GPUs of shares need three GPUs


def test_a_cell_whose_shares_pack_into_more_gpus_than_it_has_is_refused():
    with pytest.raises(PlacementError, match=r"shares of a GPU \(0.6, 0.6, 0.6\) pack into 3 whole GPUs"):
        check_fits(2, {"x": 3}, [0.6, 0.6, 0.6], cell_bundles([0.6, 0.6, 0.6])[0])


def test_an_app_that_cannot_have_a_replica_of_each_deployment_is_refused_at_once_naming_each():
    """Its first cells are placed at once, each seeing the others' GPUs free: the third of three
    one-GPU cells on two GPUs once waited out the placement timeout (60 s) and then blamed another
    job on the cluster."""

    async def scenario(runtime):
        with pytest.raises(PlacementError) as refused:
            await asyncio.wait_for(runtime.register_app(SOLO, "solo"), 5)
        return str(refused.value), runtime.resources.cells, runtime.managers

    message, cells, managers = run(scenario, gpus={"a": 2})
    assert message.startswith("app 'solo' needs 3 GPUs for one replica of each deployment (")
    assert message.count(": 1") == 3 and "the cluster has 2 free" in message
    assert cells == [] and managers == {}  # nothing of it stays


class SlowPlacing(InProcessPool):
    """Placement that takes a while, as Ray's does: cells placed at once overlap."""

    async def reserve(self, bundles, name, timeout_s, node=None):
        await asyncio.sleep(0.05)
        return await super().reserve(bundles, name, timeout_s, node)


def test_cells_placed_at_once_count_each_others_gpus():
    async def main():
        runtime = RayRuntime(values=VALUES, pool=SlowPlacing({"a": 4}))
        await runtime.start()
        try:
            await runtime.register_app(SOLO, "solo")  # 3 of the 4 GPUs
            encoder = next(k for k, m in runtime.managers.items() if type(m.task).__name__ == "EncoderTask")
            cells = (
                runtime.resources.create_cell("solo", 1, {encoder: 1}, runtime.managers) for _ in range(2)
            )
            return await asyncio.gather(*cells, return_exceptions=True)
        finally:
            await runtime.close()

    placed, refused = sorted(asyncio.run(main()), key=lambda r: isinstance(r, BaseException))
    assert not isinstance(placed, BaseException)
    # At once, not after the placement timeout with a wrong cause (another job on the cluster).
    assert isinstance(refused, PlacementError) and "1 of them taken by cells starting now" in str(refused)


def test_a_topology_plan_places_each_cell_on_the_node_it_names_and_keeps_it_there():
    """Node-pinned cells (the topology MILP's plans) go to their nodes, even where the first node
    with room is another; moving a cell to another node is a change of cell (they were refused)."""
    pinned = {
        "cells": [
            {"gpus": 1, "replicas": {"router.paths.EL.llm": 1}, "node": "b"},
            {"gpus": 1, "replicas": {"router.paths.E->L.llm": 1}, "node": "b"},
            {"gpus": 1, "replicas": {"router.paths.E->L.encoders.image": 1}, "node": "a"},
        ],
        "routing": ROUTED_PLAN["routing"],
    }
    moved = {**pinned, "cells": [{**pinned["cells"][0], "node": "a"}, *pinned["cells"][1:]]}

    async def scenario(runtime):
        app = await runtime.register_app(ROUTED_MLLM, "mllm")
        await runtime.deploy("mllm", Plan.model_validate(pinned))
        placed = sorted((c.node, c.node_id) for c in runtime.resources.cells)
        el = app.named_unit_tasks()["router.paths.EL.llm"].deployment_key()
        kept = {c.id for c in runtime.resources.cells if el not in c.replicas}
        await runtime.deploy("mllm", Plan.model_validate(moved))
        after = sorted((c.node, c.node_id) for c in runtime.resources.cells)
        stayed = kept <= {c.id for c in runtime.resources.cells}
        async with runtime.request("mllm"):
            answer = await app.serve(ChatRequest.of("served", images=[b"i"]))
        return placed, after, stayed, runtime.app_cells("mllm"), answer

    placed, after, stayed, cells, answer = run(scenario)
    assert placed == [("a", "a"), ("b", "b"), ("b", "b")]
    assert after == [("a", "a"), ("a", "a"), ("b", "b")] and stayed
    assert sorted(c.node for c in cells) == ["a", "a", "b"]  # what status and re-planning see
    assert answer.tokens


def test_a_cell_pinned_to_an_unknown_or_full_node_is_refused_before_anything_changes():
    def plan(node, count=1):
        cell = {"gpus": 1, "count": count, "replicas": {"router.paths.EL.llm": 1}, "node": node}
        return Plan.model_validate({"cells": [cell], "routing": {}})

    async def scenario(runtime):
        await runtime.register_app(ROUTED_MLLM, "mllm")
        before = cells_of(runtime)
        with pytest.raises(PlacementError) as unknown:
            await runtime.deploy("mllm", plan("c"))
        unchanged = cells_of(runtime) == before
        await runtime.deploy("mllm", plan("a", count=4))
        with pytest.raises(PlacementError) as full:  # node a's 4 GPUs are taken
            await runtime.resources.create_cell(
                "mllm", 1, {next(iter(runtime.managers)): 1}, runtime.managers, node="a"
            )
        return str(unknown.value), unchanged, str(full.value)

    unknown, unchanged, full = run(scenario)
    assert "node 'c'" in unknown and "['a', 'b']" in unknown and "prismserve-node:c" in unknown
    assert unchanged
    assert "node 'a' has 0 free GPUs" in full


def test_a_full_cluster_changes_a_cell_in_place_draining_only_the_replicas_that_go():
    """With no GPU free, a plan that swaps one deployment of a cell for another of the same shape
    keeps the cell and its other replica serving: only the replica that goes is drained (a call
    held on the kept one does not hold up the change), and the new one starts in its bundle."""
    first = {
        "cells": [
            {"gpus": 2, "replicas": {"router.paths.EL.llm": 1, "router.paths.E->L.encoders.image": 1}},
            {"gpus": 1, "replicas": {"router.paths.E->L.llm": 1}},
            {"gpus": 1, "replicas": {"router.paths.E->L.encoders.audio": 1}},
        ],
        "routing": {"text": {"EL": 1.0}},
    }
    second = {
        "cells": [
            {"gpus": 2, "replicas": {"router.paths.EL.llm": 1, "router.paths.E->L.llm": 1}},
            {"gpus": 1, "replicas": {"router.paths.E->L.llm": 1}},
            {"gpus": 1, "replicas": {"router.paths.E->L.encoders.audio": 1}},
        ],
        "routing": {"text": {"EL": 0.5, "E->L": 0.5}},
    }

    async def scenario(runtime):
        from prismserve.runtime.task_manager import Lease, ReplicaState

        app = await runtime.register_app(ROUTED_MLLM, "mllm")
        keys = {name: task.deployment_key() for name, task in app.named_unit_tasks().items()}
        await runtime.deploy("mllm", Plan.model_validate(first))
        (big,) = [c for c in runtime.resources.cells if c.gpus == 2]
        kept = next(r for m, r in big.members if m.key == keys["router.paths.EL.llm"])
        held = Lease(kept)  # a call in flight on the replica both plans keep
        await asyncio.wait_for(runtime.deploy("mllm", Plan.model_validate(second)), 10)
        held.release()
        (after,) = [c for c in runtime.resources.cells if c.gpus == 2]
        llms = runtime.managers[keys["router.paths.E->L.llm"]].replicas
        async with runtime.request("mllm"):
            answers = [await app.serve(ChatRequest.of(f"q{i}")) for i in range(4)]
        return (
            (
                after is big,
                after.replicas == {keys["router.paths.EL.llm"]: 1, keys["router.paths.E->L.llm"]: 1},
            ),
            (kept.state is ReplicaState.RUNNING, kept.drain_era, kept in [r for _, r in after.members]),
            runtime.managers[keys["router.paths.E->L.encoders.image"]].replicas,
            sorted(r.placement.cell_id for r in llms),
            answers,
        )

    (same_cell, swapped), (running, drained, member), encoders, llm_cells, answers = run(scenario, {"a": 4})
    assert same_cell and swapped
    assert running and not drained and member  # never drained, still in the cell
    assert encoders == []  # the encoder went
    assert len(llm_cells) == 2  # one E->L LLM in the reshaped cell, one in its own
    assert all(a.tokens for a in answers)
