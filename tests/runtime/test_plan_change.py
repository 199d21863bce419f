"""Applying a new plan without failing a request: cells added first, routing switched, old cells
drained, then removed. The emulated InternVL3 on in-process `sim` replicas with declared GPUs; no Ray."""

from __future__ import annotations

import asyncio
import logging

import pytest
from toy.tasks import EncoderTask

from prismserve.emulate import INTERNVL3
from prismserve.emulate.app import app_source
from prismserve.executors.spec import ExecutorSpec
from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.runtime.task_manager import Lease, Placement, ReplicaState, TaskManager, current_era, next_era
from prismserve.task.context import RequestContext, use_request

SPEEDUP = 100  # sim times / 100: a short request takes milliseconds, 3000 output tokens half a second
TEXT_FIRST = Plan.model_validate(  # the planner's 4-GPU plan for 10 % images
    {
        "cells": [{"gpus": 4, "replicas": {"PD": 1, "EPD": 1}}],
        "routing": {"text": {"PD": 1.0}, "image+text": {"EPD": 1.0}},
    }
)
IMAGES_FIRST = Plan.model_validate(  # ... and for 90 % images
    {
        "cells": [{"gpus": 2, "count": 2, "replicas": {"EPD": 1}}],
        "routing": {"text": {"EPD": 1.0}, "image+text": {"EPD": 1.0}},
    }
)


def deployment(plan: Plan) -> Plan:
    return INTERNVL3.deployment_plan(plan, SPEEDUP)


def run(scenario, gpus, **settings):
    async def main():
        runtime = RayRuntime(pool=InProcessPool(gpus), **settings)
        await runtime.start()
        try:
            app = await runtime.register_app(app_source(INTERNVL3.name), "vl")  # 11 GPUs of default cells
            return await asyncio.wait_for(scenario(runtime, app, record(runtime)), 60)
        finally:
            await runtime.close()

    return asyncio.run(main())


def record(runtime: RayRuntime) -> list[tuple[str, int, Plan | None]]:
    """What the resource manager does to cells, in order: (add | drain | remove, cell id, plan routed)."""
    events: list[tuple[str, int, Plan | None]] = []
    resources = runtime.resources
    create, drain, remove = resources.create_cell, resources.drain_cell, resources.remove_cell

    async def create_cell(*args, **kwargs):
        cell = await create(*args, **kwargs)
        events.append(("add", cell.id, runtime.plans.get("vl")))
        return cell

    async def drain_cell(cell, *args, **kwargs):
        events.append(("drain", cell.id, runtime.plans.get("vl")))
        return await drain(cell, *args, **kwargs)

    async def remove_cell(cell):
        events.append(("remove", cell.id, runtime.plans.get("vl")))
        return await remove(cell)

    resources.create_cell, resources.drain_cell, resources.remove_cell = create_cell, drain_cell, remove_cell
    return events


async def ask(runtime, app, tokens: int = 16):
    async with runtime.request("vl", "text"):
        return await app.serve(ChatRequest.of("how are the cars parked", max_tokens=tokens))


async def until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def replica_of(runtime, option: str, cell_id: int):
    (manager,) = [m for m in runtime.managers.values() if m.task.option == option]
    (replica,) = [r for r in manager.replicas if r.placement.cell_id == cell_id]
    return replica


def test_with_room_new_cells_start_first_and_a_request_on_a_dropped_cell_finishes():
    async def scenario(runtime, app, events):
        await runtime.deploy("vl", deployment(TEXT_FIRST))  # 4 GPUs fit beside the 11 registered
        (old,) = [c.id for c in runtime.resources.cells]
        assert [e[0] for e in events][0] == "add"
        events.clear()
        pd = replica_of(runtime, "PD", old)
        long = asyncio.ensure_future(ask(runtime, app, tokens=3000))
        await until(lambda: pd.in_flight == 1)
        await runtime.deploy("vl", deployment(IMAGES_FIRST))
        assert long.done()  # the drain waited for it ...
        answer = long.result()
        after = await ask(runtime, app)  # ... and new requests go to the new cells
        return old, list(events), answer, after, [c.gpus for c in runtime.resources.cells]

    old, events, answer, after, cells = run(scenario, {"a": 16})
    new = deployment(IMAGES_FIRST)
    assert [(kind, cell) for kind, cell, _ in events][2:] == [("drain", old), ("remove", old)]
    assert [kind for kind, _, _ in events[:2]] == ["add", "add"]
    assert events[2][2] == new  # routing had switched to the new plan before the old cell drained
    assert len(answer.text.split()) == 3000 and len(after.text.split()) == 16
    assert cells == [2, 2]


def test_with_the_gpus_full_requests_wait_for_cells_that_start_after_the_old_ones_drained():
    async def scenario(runtime, app, events):
        deploying = asyncio.ensure_future(runtime.deploy("vl", deployment(TEXT_FIRST)))
        await until(lambda: any(kind == "drain" for kind, _, _ in events))
        # Routed by the new plan to PD, whose only replica is draining and whose new one is expected.
        waiting = [asyncio.ensure_future(ask(runtime, app)) for _ in range(3)]
        await deploying
        return list(events), await asyncio.gather(*waiting)

    events, answers = run(scenario, {"a": 11})
    kinds = [kind for kind, _, _ in events]
    # Nothing fitted beside the 11 registered GPUs: drain and remove them all, then add.
    assert kinds[-1] == "add" and sorted(kinds[:-1]) == ["drain"] * 6 + ["remove"] * 6
    assert all(plan == deployment(TEXT_FIRST) for _, _, plan in events)
    assert [len(a.text.split()) for a in answers] == [16, 16, 16]


def test_a_request_that_finds_the_old_replicas_gone_and_the_new_ones_starting_waits_for_them():
    """The window of a full cluster's plan change between removing the old cells and adding the new:
    a deployment has no replica, but some are announced; a request waits for them, not a 503."""

    async def scenario(runtime, app, events):
        resources, create = runtime.resources, runtime.resources.create_cell
        asked = []

        async def create_cell(*args, **kwargs):  # every old cell gone, the new one not yet started
            if not asked and not any(m.replicas for m in runtime.managers.values()):
                asked.append(asyncio.ensure_future(ask(runtime, app)))
                await until(
                    lambda: any(m.stats.waiting for m in runtime.managers.values()) or asked[0].done()
                )
            return await create(*args, **kwargs)

        resources.create_cell = create_cell
        await runtime.deploy("vl", deployment(TEXT_FIRST))
        return await asked[0]

    answer = run(scenario, {"a": 11})
    assert len(answer.text.split()) == 16


def test_a_new_cell_the_cluster_cannot_place_yet_starts_after_the_drain(caplog):
    """GPUs free by the runtime's count but held in the cluster (another job, a placement group not yet
    released): the new cell is not placed early, and the plan still applies."""

    async def scenario(runtime, app, events):
        await runtime.pool.reserve([{"GPU": 5.0}], "another-job", 1.0)  # 11 registered + 5 = all 16
        with caplog.at_level(logging.INFO, logger="prismserve.runtime.resources"):
            await runtime.deploy("vl", deployment(TEXT_FIRST))
        return list(events), [c.gpus for c in runtime.resources.cells], await ask(runtime, app)

    events, cells, answer = run(scenario, {"a": 16})
    kinds = [kind for kind, _, _ in events]
    assert kinds[-1] == "add" and sorted(kinds[:-1]) == ["drain"] * 6 + ["remove"] * 6
    assert cells == [4] and len(answer.text.split()) == 16
    assert (
        "a new cell of vl starts after the old cells drain: cell of 4 GPUs could not be placed" in caplog.text
    )


def test_a_cell_that_does_not_drain_in_time_is_removed_anyway_and_logged(caplog):
    async def scenario(runtime, app, events):
        await runtime.deploy("vl", deployment(TEXT_FIRST))
        (cell,) = runtime.resources.cells
        stuck = Lease(replica_of(runtime, "PD", cell.id))  # a call that never answers
        with caplog.at_level(logging.WARNING, logger="prismserve.runtime.resources"):
            await runtime.deploy("vl", deployment(IMAGES_FIRST))
        stuck.release()
        return cell.id, [c.id for c in runtime.resources.cells]

    old, cells = run(scenario, {"a": 16}, drain_timeout_s=0.2)
    assert old not in cells and len(cells) == 2
    assert (
        f"cell {old} of vl stopped draining (no request finished for 0 s): removing it with 1 calls"
        in caplog.text
    )


def test_a_draining_replica_takes_leases_only_when_no_other_can_and_leases_wait_for_expected_ones():
    async def scenario():
        manager = TaskManager(
            "enc", EncoderTask(model_id="m", modality="image"), ExecutorSpec(), 0, pool=InProcessPool()
        )
        first = await manager.add_replica(Placement(None, 0, 1))
        second = await manager.add_replica(Placement(None, 1, 1))
        first.drain(next_era())
        picks = {(await manager.lease()).replica.id for _ in range(4)}
        second.drain(next_era())
        fallback = (await manager.lease()).replica  # nothing expected: a draining replica serves
        manager.expect(1)
        waiting = asyncio.ensure_future(manager.lease())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # waits for the replica announced
        third = await manager.add_replica(Placement(None, 2, 1))
        manager.expect(-1)
        return picks, second.id, fallback, (await waiting).replica is third

    picks, second, fallback, waited = asyncio.run(scenario())
    assert picks == {second}
    assert fallback.state is ReplicaState.DRAINING and waited


def test_with_new_replicas_expected_a_request_begun_before_the_switch_goes_on_at_once_and_a_later_one_waits():
    """A request begun before a plan switch holds work on the draining replicas: it takes them at once
    (waiting would hold up the drain the new replicas wait for); one begun after waits for the new
    replicas, however long the drain takes, rather than join the draining ones."""

    async def scenario():
        manager = TaskManager(
            "enc", EncoderTask(model_id="m", modality="image"), ExecutorSpec(), 0, pool=InProcessPool()
        )
        old = await manager.add_replica(Placement(None, 0, 1))
        with use_request(
            RequestContext(era=current_era())
        ):  # a request begins; while it runs, a plan switch drains `old`
            manager.expect(1)
            old.drain(next_era())
            manager.restart_wait_s = 60.0
            before = await asyncio.wait_for(manager.lease(), 10)  # its next call: at once
        manager.restart_wait_s = 0.1  # what a restart waits: not what bounds the wait for a plan's replicas
        with use_request(RequestContext(era=current_era())):  # a request begun after the switch
            after = asyncio.ensure_future(manager.lease())
        await asyncio.sleep(0.3)
        assert not after.done()
        new = await manager.add_replica(Placement(None, 1, 1))
        manager.expect(-1)
        return before.replica is old, (await after).replica is new

    assert asyncio.run(scenario()) == (True, True)


@pytest.mark.reliability
def test_a_cell_drains_as_long_as_its_requests_keep_finishing_past_the_drain_timeout(caplog):
    """Under sustained overload a dropped cell's queue outlasts the drain timeout: it is removed
    once its last request finished, not at the timeout (those requests failed), since one of them
    finished within each timeout."""

    async def scenario(runtime, app, events):
        await runtime.deploy("vl", deployment(TEXT_FIRST))
        (cell,) = runtime.resources.cells
        queue = [Lease(replica_of(runtime, "PD", cell.id)) for _ in range(4)]

        placed = []  # whether the cell was still up at each release

        async def finish_one_by_one():
            for lease in queue:
                await asyncio.sleep(0.15)  # each within the 0.25 s timeout, all four past it
                placed.append(cell in runtime.resources.cells)
                lease.release()

        loop = asyncio.get_running_loop()
        start = loop.time()
        with caplog.at_level(logging.WARNING, logger="prismserve.runtime.resources"):
            await asyncio.gather(finish_one_by_one(), runtime.deploy("vl", deployment(IMAGES_FIRST)))
        return cell.id, [c.id for c in runtime.resources.cells], loop.time() - start, placed

    old, cells, took, placed = run(scenario, {"a": 16}, drain_timeout_s=0.25)
    assert placed == [True] * 4 and old not in cells  # removed after its last request finished
    assert took >= 0.6
    assert "stopped draining" not in caplog.text
