"""TaskManager: the replicas of one unit-task deployment — start, health, restart, pick."""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from prismserve.errors import NoReplicaError, ReplicaStartError
from prismserve.executors.loading import START_TIMEOUT_VARIABLE
from prismserve.executors.spec import ExecutorSpec
from prismserve.runtime.pool import ReplicaPool, WirePool
from prismserve.runtime.stage_stats import StageStats
from prismserve.runtime.wire import ReplicaAddress
from prismserve.task import UnitTask
from prismserve.task.context import current_request
from prismserve.task.routing import RoutingPolicy

log = logging.getLogger(__name__)

_replica_ids = itertools.count()

# Plan switches so far in this process. A request's context counts those before it began (its
# `era`): a replica drained by a later switch holds the request's earlier work, so the request goes
# on there; a request begun after the switch waits for the new ones.
_switches = 0


def current_era() -> int:
    """Plan switches so far: the era of a request beginning now."""
    return _switches


def next_era() -> int:
    """Count a plan switch: the era of the replicas it drains."""
    global _switches
    _switches += 1
    return _switches


@dataclass(eq=False)
class Placement:
    """Where a replica runs: a bundle of a cell's placement group."""

    placement_group: Any
    bundle_index: int
    gpus: float  # GPUs of the replica: a share of one, or whole ones
    cell_id: int = -1


class ReplicaState(enum.Enum):
    """Where a replica is in its life. Leases go to running replicas, and to draining ones only
    when no running one can take them; the others take none."""

    STARTING = "starting"  # its first start: loading
    RUNNING = "running"
    DRAINING = "draining"  # its cell is being removed: it finishes what its requests began
    RESTARTING = "restarting"  # it failed and is being replaced (or waits for the next try)
    STOPPING = "stopping"  # removed: its actor is being stopped


@dataclass(eq=False)
class Replica:
    """One executor replica: its actor and where it runs."""

    id: int
    placement: Placement
    handle: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    state: ReplicaState = ReplicaState.STARTING
    in_flight: int = 0  # leases held: changed by Lease only
    pending_tokens: int = 0  # tokens of the leases held: changed by Lease only
    restarts: int = 0
    starting: asyncio.Task[None] | None = None  # its restart, while one is under way
    spec: ExecutorSpec | None = None
    actor_id: str = ""  # tells this replica's death from its producers' in a failed call
    address: ReplicaAddress | None = None  # its socket (runtime/wire.py)
    leftovers: dict[str, Any] | None = None  # its processes and segments, removed when it stops
    late: int = 0  # health checks in a row it did not answer in time
    node_gone: bool = False  # its last restart failed because its node left the cluster
    drain_era: int = 0  # the plan switch that drains it (0: none): requests begun before it may still use it
    users: int = 0  # open request scopes whose graphs ran on it (their payloads and streams are here)
    # What the profiler reads: leases taken, and seconds with at least one lease held (busy).
    calls: int = 0
    busy_s: float = 0.0
    busy_since: float = 0.0

    @property
    def up(self) -> bool:
        """Whether it answers calls: running or draining."""
        return self.state is ReplicaState.RUNNING or self.state is ReplicaState.DRAINING

    def drain(self, era: int) -> None:
        """Take no new leases while others can (from plan switch `era` on); once back up if it is restarting."""
        self.drain_era = era
        if self.up:
            self.state = ReplicaState.DRAINING


class Lease:
    """One invocation's hold on a replica: counted in the replica's `in_flight` until released.

    The task manager hands leases out and the dispatcher gives each back once, whatever happens to
    the call; a restart leaves the count alone (calls on the dead actor fail and give theirs back),
    so the count is exact after any number of restarts and never negative.
    """

    __slots__ = ("replica", "tokens", "_held")

    def __init__(self, replica: Replica, tokens: int = 1) -> None:
        self.replica = replica
        self.tokens = tokens
        self._held = True
        replica.calls += 1
        if not replica.in_flight:
            replica.busy_since = time.perf_counter()
        replica.in_flight += 1
        replica.pending_tokens += tokens

    def release(self) -> None:
        """Give the lease back; later calls do nothing."""
        if self._held:
            self._held = False
            replica = self.replica
            replica.in_flight -= 1
            replica.pending_tokens -= self.tokens
            if not replica.in_flight:
                replica.busy_s += time.perf_counter() - replica.busy_since


class TaskManager:
    """Owns the replicas of one deployment (an equivalence class of unit tasks, shared across apps).

    It hands out leases on them (`lease`), restarts those that die, and leaves starting, asking and
    stopping them to its pool (Ray actors by default).
    """

    def __init__(
        self,
        key: str,
        task: UnitTask[Any, Any],
        spec: ExecutorSpec,
        slab_bytes: int,
        pool: ReplicaPool | None = None,
        restart_wait_s: float = 60.0,
    ) -> None:
        self.key = key
        self.task = task
        self.spec = spec
        self.slab_bytes = slab_bytes
        self.pool = pool or WirePool()
        self.replicas: list[Replica] = []
        # How long an invocation waits for a restarting replica when no other one is healthy.
        self.restart_wait_s = restart_wait_s
        self._next = 0
        # Replicas a plan change is about to start (set by the resource manager) or starting now:
        # while none is leasable but some are expected, a lease waits for them instead of failing.
        self.expected = 0
        self._changed = asyncio.Event()  # set (and replaced) when a replica comes up or `expected` drops
        # This deployment's replica choice (None: the dispatcher's policy); apps set it per deployment.
        self.policy: RoutingPolicy | None = None
        self.tokens = 0  # tokens of every lease taken: the load the autoscaler reads (tokens/s)
        self.stats = StageStats()  # what its calls did, for the gateway's metrics

    # Health checks in a row a replica may leave unanswered before it is restarted: a replica busy on
    # an overloaded machine answers late, and a restart would lose the work it has in hand. A replica
    # that died or says it cannot serve is restarted at the first check.
    LATE_CHECKS = 3

    @property
    def start_timeout_s(self) -> float:
        """How long a replica may take to start: its executor spec's, computed from the model's size."""
        return self.spec.start_timeout_s

    @property
    def name(self) -> str:
        """Short name for messages: the unit task's class."""
        return type(self.task).__name__

    async def add_replica(self, placement: Placement) -> Replica:
        """Start a replica on `placement` and wait until it is ready."""
        replica = Replica(next(_replica_ids), placement)
        self.replicas.append(replica)
        self.expected += 1
        try:
            await self._start(replica)
        finally:
            self.expect(-1)
        return replica

    def expect(self, replicas: int) -> None:
        """Announce `replicas` more replicas about to start (negative: fewer); leases wait for them
        while no replica is leasable."""
        self.expected += replicas
        self._notify()

    def _notify(self) -> None:
        """Wake the leases waiting for a replica."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def remove_replica(self, replica: Replica) -> None:
        """Stop a replica and forget it."""
        if replica in self.replicas:
            self.replicas.remove(replica)
            self._notify()
        replica.state = ReplicaState.STOPPING
        await self.pool.stop(replica)
        replica.address = None  # a late release (a request that ended after) finds nothing to send to

    async def _start(self, replica: Replica) -> None:
        replica.spec = self.spec
        try:
            await self.pool.start(self, replica)
        except TimeoutError:
            raise ReplicaStartError(
                f"replica {replica.id} of {self.name} did not start within {self.start_timeout_s:.0f} s: "
                f"set {START_TIMEOUT_VARIABLE} (seconds) where prismserve serves to allow it longer"
            ) from None
        replica.state = ReplicaState.DRAINING if replica.drain_era else ReplicaState.RUNNING

    def restart(self, replica: Replica, reason: str = "it failed") -> asyncio.Task[None]:
        """Replace a replica by a new one on the same placement (once at a time)."""
        if replica.starting is None or replica.starting.done():
            replica.state = ReplicaState.RESTARTING
            replica.starting = asyncio.get_running_loop().create_task(self._restart(replica, reason))
            self._notify()  # leases waiting for it wait for this start
        return replica.starting

    async def _restart(self, replica: Replica, reason: str) -> None:
        if replica not in self.replicas:  # removed (its cell is gone): a call that failed on it says so
            return
        log.warning("restarting replica %d of %s: %s", replica.id, self.name, reason)
        await self.pool.stop(replica)
        if replica not in self.replicas:  # removed while it stopped: starting it would leak an actor
            return
        replica.restarts += 1
        replica.late = 0
        try:
            await self._start(replica)
        except Exception:  # noqa: BLE001 - stays unhealthy; the health check tries again
            replica.node_gone = self.pool.node_gone(replica)
            log.exception("replica %d of %s failed to restart", replica.id, self.name)
        else:
            replica.node_gone = False

    async def respec(self, spec: ExecutorSpec) -> None:
        """Use a new executor spec: replicas started with another one are replaced."""
        self.spec = spec
        stale = [r for r in self.replicas if r.spec != spec]
        await asyncio.gather(*(self.restart(r, "its executor spec changed") for r in stale))

    async def check_health(self, timeout_s: float) -> None:
        """Ping every healthy replica; restart those that died, say they cannot serve, or left
        `LATE_CHECKS` pings in a row unanswered within `timeout_s`, and those that failed to restart."""
        for replica in list(self.replicas):
            if not replica.up:
                if (
                    replica.state is ReplicaState.RESTARTING
                    and replica.starting is not None
                    and replica.starting.done()
                ):
                    self.restart(replica, "its last restart failed")
                continue
            try:
                await asyncio.wait_for(self.pool.health(replica), timeout_s)
            except TimeoutError:
                replica.late += 1
                log.warning(
                    "replica %d of %s did not answer its health check within %.1f s (%d of %d in a row)",
                    replica.id,
                    self.name,
                    timeout_s,
                    replica.late,
                    self.LATE_CHECKS,
                )
                if replica.late >= self.LATE_CHECKS:
                    self.restart(replica, f"it did not answer {replica.late} health checks in a row")
            except Exception as exc:  # noqa: BLE001 - dead replica or unhealthy executor
                log.warning("replica %d of %s failed its health check: %r", replica.id, self.name, exc)
                self.restart(replica)
            else:
                replica.late = 0

    async def lease(self, policy: RoutingPolicy = "static", tokens: int = 1) -> Lease:
        """A lease on the replica the next invocation (of `tokens` pending tokens) goes to, picked by
        this deployment's `policy` if it has one, else by `policy`; it counts at once, so the next
        pick (of the same request, too) sees it.

        While every replica is restarting, or a plan change is starting the replicas that will take
        the place of draining ones, waits for one (at most `restart_wait_s`) instead of failing; a
        draining replica is taken only when no other can be.
        """
        if not any(r.state is ReplicaState.RUNNING for r in self.replicas):
            era = current_request().era
            self.stats.waiting += 1
            try:
                if era is None:  # outside a request: as for a restart
                    await self.wait_healthy(self.restart_wait_s)
                elif any(r.state is ReplicaState.DRAINING and r.drain_era > era for r in self.replicas):
                    pass  # a request begun before the switch finishes on the old replicas, at once
                else:  # a request begun after it waits for the new ones (they start once the old drained)
                    await self.wait_healthy(math.inf)
            finally:
                self.stats.waiting -= 1
        policy = self.policy or policy
        self.tokens += tokens
        if policy == "dynamic":
            return Lease(await self._least_loaded(), tokens)
        return Lease(self._pick("pending_tokens" if policy == "tokens" else "in_flight"), tokens)

    def _pick(self, count: str) -> Replica:
        """The running replica with the least of `count` (`in_flight`: leases, request-static
        routing; `pending_tokens`: token-aware), round-robin among ties; draining replicas only when
        no replica is running.

        Plain round-robin left replicas of static-batching executors unevenly loaded under
        heavy-tailed requests (benchmarks/README.md); the counts are free, kept as calls go out.
        """
        replicas = self.replicas
        best: Replica | None = None
        for step in range(len(replicas)):
            replica = replicas[(self._next + step) % len(replicas)]
            if replica.up and (
                best is None
                or (best.state is ReplicaState.DRAINING and replica.state is ReplicaState.RUNNING)
                or (best.state is replica.state and getattr(replica, count) < getattr(best, count))
            ):
                best = replica
        if best is None:
            raise NoReplicaError(f"{self.name} has no healthy replica (of {len(replicas)})")
        self._next += 1
        return best

    async def _least_loaded(self) -> Replica:
        """Ask every running replica for its queue depth and take the shortest (dynamic routing);
        draining replicas only when no replica is running."""
        healthy = [r for r in self.replicas if r.state is ReplicaState.RUNNING] or [
            r for r in self.replicas if r.up
        ]
        if not healthy:
            raise NoReplicaError(f"{self.name} has no healthy replica (of {len(self.replicas)})")
        depths = await asyncio.gather(*(self.pool.queue_depth(r) for r in healthy), return_exceptions=True)
        scored = [(d, i) for i, d in enumerate(depths) if isinstance(d, int)]
        if not scored:
            raise NoReplicaError(f"no replica of {self.name} answered")
        return healthy[min(scored)[1]]

    async def wait_healthy(self, timeout_s: float) -> None:
        """Wait until some replica is running (restarts in progress, replicas a plan change is
        starting), at most `timeout_s`; at once if none is starting or expected. A replica whose
        restart failed because its node left the cluster counts as starting: its cell is about to
        be placed on another node (`ResourceManager.replace_lost`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not any(r.state is ReplicaState.RUNNING for r in self.replicas):
            starting = [r.starting for r in self.replicas if r.starting is not None and not r.starting.done()]
            restarting = any(r.state is ReplicaState.RESTARTING and r.node_gone for r in self.replicas)
            left = deadline - loop.time()
            if (not starting and not restarting and not self.expected) or left <= 0:
                return
            changed = loop.create_task(self._changed.wait())
            try:
                await asyncio.wait([*starting, changed], timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()

    def queue_depth(self) -> int:
        """Invocations in flight on this deployment: the leases held."""
        return sum(r.in_flight for r in self.replicas)

    async def close(self) -> None:
        """Stop every replica."""
        await asyncio.gather(*(self.pool.stop(r) for r in self.replicas))
        self.replicas.clear()
