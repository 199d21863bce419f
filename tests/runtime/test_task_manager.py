"""The task manager's bookkeeping on in-process replicas: leases, picks, restarts. No Ray."""

from __future__ import annotations

import asyncio

import pytest
from toy.tasks import EncoderTask

from prismserve.executors.spec import ExecutorSpec
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.runtime.task_manager import (
    Lease,
    NoReplicaError,
    Placement,
    TaskManager,
    next_era,
)


class FakePool(InProcessPool):
    """In-process replicas that take `start_s` to start (or fail to, while `broken`) and report set depths."""

    def __init__(self, start_s: float = 0.0) -> None:
        super().__init__()
        self.start_s = start_s
        self.broken = False
        self.depths: dict[int, int] = {}
        self.answer_s = 0.0  # how long a health check takes to answer
        self.unhealthy = False

    async def start(self, manager, replica) -> None:
        await asyncio.sleep(self.start_s)
        if self.broken:
            raise RuntimeError("the executor did not load")
        await super().start(manager, replica)

    async def queue_depth(self, replica) -> int:
        return self.depths.get(replica.id, 0)

    async def health(self, replica) -> None:
        await asyncio.sleep(self.answer_s)
        if self.unhealthy:
            raise RuntimeError("the executor cannot serve")


async def manager_with(replicas: int, pool: FakePool, restart_wait_s: float = 5.0) -> TaskManager:
    manager = TaskManager(
        "enc",
        EncoderTask(model_id="m", modality="image"),
        ExecutorSpec(),
        0,
        pool=pool,
        restart_wait_s=restart_wait_s,
    )
    for i in range(replicas):
        await manager.add_replica(Placement(None, i, 1))
    return manager


def test_each_lease_sees_the_leases_taken_before_it():
    async def scenario():
        manager = await manager_with(2, FakePool())
        busy, idle = manager.replicas
        Lease(busy), Lease(busy)  # two calls of other requests are out on `busy`
        picks = [(await manager.lease()).replica for _ in range(4)]  # e.g. four images of one request
        return picks, busy, idle

    picks, busy, idle = asyncio.run(scenario())
    assert picks[:2] == [idle, idle]  # the less loaded replica first, until it is as loaded
    assert busy in picks[2:] and idle in picks[2:]  # then both: the request is spread
    assert busy.in_flight == idle.in_flight == 3


def test_a_replica_goes_through_its_states_and_one_restarted_while_draining_comes_back_draining():
    async def scenario():
        pool = FakePool(start_s=0.05)
        manager = await manager_with(1, pool)
        (replica,) = manager.replicas
        states = [replica.state]
        restart = manager.restart(replica, "test")
        states.append(replica.state)
        await restart
        states.append(replica.state)
        replica.drain(next_era())
        states.append(replica.state)
        restart = manager.restart(replica, "test")
        replica.drain(next_era())  # its cell is removed by a later plan change while it restarts
        states.append(replica.state)
        await restart
        states.append(replica.state)
        await manager.remove_replica(replica)
        states.append(replica.state)
        return states

    assert [state.value for state in asyncio.run(scenario())] == [
        "running",
        "restarting",
        "running",
        "draining",
        "restarting",
        "draining",
        "stopping",
    ]


def test_in_flight_counts_stay_exact_across_restarts_and_double_releases():
    async def scenario():
        manager = await manager_with(1, FakePool())
        (replica,) = manager.replicas
        leases = [await manager.lease() for _ in range(3)]
        for _ in range(2):  # two restarts while the three calls are out
            await manager.restart(replica, "test")
        during = replica.in_flight
        for lease in leases:
            lease.release()
            lease.release()  # a second release is a no-op
        after = replica.in_flight
        fresh = await manager.lease()
        return during, after, replica, fresh, manager

    during, after, replica, fresh, manager = asyncio.run(scenario())
    assert during == 3  # the restart does not forget calls still out
    assert after == 0  # and they give their leases back once: never negative
    assert replica.restarts == 2 and replica.up
    assert fresh.replica is replica and manager.queue_depth() == 1


def test_a_lease_waits_for_the_only_replica_to_restart():
    async def scenario():
        pool = FakePool()
        manager = await manager_with(1, pool)
        (replica,) = manager.replicas
        pool.start_s = 0.3
        manager.restart(replica, "test")
        assert not replica.up
        lease = await manager.lease()
        return lease, replica

    lease, replica = asyncio.run(scenario())
    assert lease.replica is replica and replica.up and replica.restarts == 1


def test_the_wait_for_a_restart_is_bounded():
    async def scenario():
        pool = FakePool()
        manager = await manager_with(1, pool, restart_wait_s=0.2)
        pool.start_s = 30.0
        manager.restart(manager.replicas[0], "test")
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(NoReplicaError, match="no healthy replica"):
            await manager.lease()
        return loop.time() - began

    assert 0.15 < asyncio.run(scenario()) < 5


def test_a_failed_restart_fails_the_lease_without_waiting_it_out():
    async def scenario():
        pool = FakePool()
        manager = await manager_with(1, pool, restart_wait_s=30.0)
        pool.broken = True
        await manager.restart(manager.replicas[0], "test")
        with pytest.raises(NoReplicaError):
            await asyncio.wait_for(manager.lease(), 5)
        pool.broken = False
        await manager.check_health(timeout_s=1.0)  # retries the restart
        await manager.replicas[0].starting
        return await manager.lease()

    assert asyncio.run(scenario()).replica.up


def test_a_busy_replica_that_answers_health_checks_late_is_restarted_only_after_three_in_a_row():
    """A replica slow to answer (busy on an overloaded machine) keeps its work: one or two late
    answers are forgiven, an answer in time clears them, the third late one in a row restarts it; a
    replica that says it cannot serve is restarted at once."""

    async def scenario():
        pool = FakePool()
        manager = await manager_with(1, pool)
        (replica,) = manager.replicas
        pool.answer_s = 0.2
        for _ in range(2):
            await manager.check_health(timeout_s=0.05)
        forgiven = (replica.up, replica.restarts)
        pool.answer_s = 0.0
        await manager.check_health(timeout_s=0.05)  # in time: the count starts over
        pool.answer_s = 0.2
        for _ in range(2):
            await manager.check_health(timeout_s=0.05)
        still = (replica.up, replica.restarts)
        await manager.check_health(timeout_s=0.05)
        await replica.starting
        late = replica.restarts
        pool.answer_s, pool.unhealthy = 0.0, True
        await manager.check_health(timeout_s=0.05)
        pool.unhealthy = False
        await replica.starting
        return forgiven, still, late, replica.restarts

    forgiven, still, late, unhealthy = asyncio.run(scenario())
    assert forgiven == (True, 0) and still == (True, 0)
    assert late == 1 and unhealthy == 2


def test_dynamic_leases_go_to_the_shortest_reported_queue():
    async def scenario():
        pool = FakePool()
        manager = await manager_with(3, pool)
        pool.depths = {manager.replicas[0].id: 5, manager.replicas[1].id: 1, manager.replicas[2].id: 3}
        return manager, await manager.lease("dynamic")

    manager, lease = asyncio.run(scenario())
    assert lease.replica is manager.replicas[1] and lease.replica.in_flight == 1


def test_token_aware_leases_go_to_the_fewest_pending_tokens_and_give_them_back():
    async def scenario():
        manager = await manager_with(3, FakePool())
        manager.policy = "tokens"  # the deployment's own choice, over the dispatcher's
        a, b, c = manager.replicas
        held = [Lease(a, 900), Lease(b, 100)]
        picks = [await manager.lease("static", tokens) for tokens in (500, 300, 50)]
        pending = [r.pending_tokens for r in manager.replicas]
        for lease in held + picks:
            lease.release()
        return [p.replica for p in picks], (a, b, c), pending, [r.pending_tokens for r in manager.replicas]

    picks, (a, b, c), pending, after = asyncio.run(scenario())
    assert picks == [c, b, b]  # c: 0 < 100 < 900; then b: 100 < 500; then b: 400 < 500
    assert pending == [900, 450, 500] and after == [0, 0, 0]


def test_close_ends_health_checks_that_swallow_a_cancellation():
    """Python 3.11's `asyncio.wait_for` (a health check's) can swallow a cancellation that comes as
    the call it waits for returns; close cancels again until the checks end instead of waiting forever."""

    async def scenario():
        runtime = RayRuntime()  # not started: no Ray
        swallowed = 0

        async def checks():
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    if swallowed:
                        raise
                    swallowed += 1  # as wait_for does when its call returns at the same time

        runtime._health = asyncio.get_running_loop().create_task(checks())
        await asyncio.sleep(0.05)
        health = runtime._health
        closing = asyncio.get_running_loop().create_task(runtime.close())
        done, _ = await asyncio.wait([closing], timeout=10)  # not wait_for: its timeout would cancel again
        health.cancel()  # where close hung: let the loop end
        return bool(done), swallowed, runtime._health

    assert asyncio.run(scenario()) == (True, 1, None)
