"""ReplicaPool: how a deployment's replicas are started, called and stopped.

The task manager owns the bookkeeping (health, restarts, leases, picks) and the dispatcher the
graph; both leave the mechanics to a pool. `RayActorPool` runs each replica as a Ray actor in its
cell's placement-group bundle, and a call's inputs travel as Ray object references between actors.
`InProcessPool` runs the same replica class in this process, with asyncio tasks for references: the
in-process runtime, `LocalDispatcher` and the control plane's unit tests use it, and can stop a
replica under a call to exercise the fault paths without a cluster.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from prismserve.errors import PrismserveError, ReplicaGone
from prismserve.runtime import leftovers
from prismserve.runtime.cluster import local_ray_down
from prismserve.runtime.wire import WireClient, connection, disconnect

if TYPE_CHECKING:
    from prismserve.runtime.replica import Call
    from prismserve.runtime.task_manager import Replica, TaskManager
    from prismserve.task import UnitTask

log = logging.getLogger(__name__)

Death = Literal["replica", "input"]

# A Ray node's name for plans that pin cells (`node`): `ray start --resources '{"prismserve-node:NAME": 1}'`.
NODE_RESOURCE = "prismserve-node:"
_PIN = 0.001  # of a node's naming resource, per bundle: pins the bundle, takes nothing


class ReplicaPool(ABC):
    """Starts, calls, health-checks and stops the replicas of task managers."""

    @abstractmethod
    async def start(self, manager: TaskManager, replica: Replica) -> None:
        """Start `replica` of `manager`'s deployment and load its executor; sets `handle`, `info`
        and `actor_id`. Raises TimeoutError after `manager.start_timeout_s`."""

    @abstractmethod
    async def stop(self, replica: Replica) -> None:
        """Stop `replica`; never raises (a dead replica is already stopped)."""

    @abstractmethod
    async def health(self, replica: Replica) -> None:
        """Raise if the replica cannot serve."""

    @abstractmethod
    async def queue_depth(self, replica: Replica) -> int:
        """Invocations running or waiting on the replica, as the replica counts them."""

    @abstractmethod
    def submit(
        self, replica: Replica, calls: list[Call], producers: list[int], produced: Sequence[Any]
    ) -> list[Any]:
        """Send independent invocations of one graph to `replica`, with the references of their
        producers' results (`produced`, in `producers` order); one result reference per call."""

    @abstractmethod
    async def result(self, ref: Any) -> Any:
        """The value behind a result reference; raises the call's failure."""

    @abstractmethod
    def cause(self, error: BaseException) -> BaseException:
        """The failure a call raised, unwrapped from the transport's error."""

    @abstractmethod
    def death(self, error: BaseException, replica: Replica) -> Death | None:
        """Whether a call on `replica` failed because `replica` died, because the replica holding
        one of its inputs died, or (None) for another reason."""

    @abstractmethod
    def release(self, replica: Replica, requests: list[str]) -> None:
        """Free what executed graphs (`requests`) left on the replica; never raises."""

    @abstractmethod
    def inventory(self) -> dict[str, float]:
        """GPUs of each alive node (real or declared)."""

    def node_gone(self, replica: Replica) -> bool:
        """Whether the node `replica` ran on has left the cluster."""
        node = (replica.info or {}).get("node_id")
        return bool(node) and node not in self.inventory()

    @abstractmethod
    def node_names(self) -> dict[str, str]:
        """The names a plan may pin cells to (`CellPlan.node`), with the node each names."""

    @abstractmethod
    async def reserve(
        self, bundles: list[dict[str, float]], name: str, timeout_s: float, node: str | None = None
    ) -> tuple[Any, str]:
        """Reserve `bundles` packed on one node (the node named `node`, from `node_names`, if
        given); returns (the reservation, its node). Raises TimeoutError when they cannot be placed
        in time (the reservation is then undone)."""

    @abstractmethod
    def unreserve(self, reservation: Any) -> None:
        """Give a reservation's resources back."""


class RayActorPool(ReplicaPool):
    """Replicas as Ray actors, each in its bundle of a cell's placement group."""

    async def start(self, manager: TaskManager, replica: Replica) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from prismserve.runtime.replica import ExecutorReplica

        actor_cls = ray.remote(ExecutorReplica)
        replica.handle = actor_cls.options(
            runtime_env=manager.spec.runtime_env,
            num_cpus=0,
            num_gpus=replica.placement.gpus,
            max_concurrency=10_000,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=replica.placement.placement_group,
                placement_group_bundle_index=replica.placement.bundle_index,
            ),
        ).remote(manager.key, manager.task, manager.spec, manager.slab_bytes)
        try:
            replica.info = await asyncio.wait_for(replica.handle.start.remote(), manager.start_timeout_s)
        except ray.exceptions.RayTaskError as exc:
            cause = self.cause(exc)
            if isinstance(cause, PrismserveError):  # raised on purpose: its message is for the user
                raise cause from None
            raise
        replica.actor_id = replica.info.get("actor_id", "")
        replica.address = replica.info.pop("wire")  # holds its token: not for /admin/status
        replica.leftovers = replica.info.pop("leftovers", None)

    async def stop(self, replica: Replica) -> None:
        """Stop the replica (its executor closed), kill its actor, then remove what outlived both
        (an engine's processes and shared memory). With the local Ray gone already (a signal to
        the whole process group), Ray is not asked: its calls would wait for it for a minute."""
        handle = replica.handle
        if handle is None:
            return
        import ray

        ray_down = local_ray_down()
        if not ray_down:
            with contextlib.suppress(Exception):  # already dead or stuck: killing is what matters
                await asyncio.wait_for(handle.stop.remote(), 5)
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        # The replica's process too where no Ray is left to end it.
        removed = await asyncio.to_thread(leftovers.remove, replica.leftovers, root=ray_down)
        if removed:
            log.info("removed what replica %s left: %s", replica.id, ", ".join(removed))

    async def health(self, replica: Replica) -> None:
        await replica.handle.health.remote()

    async def queue_depth(self, replica: Replica) -> int:
        return await replica.handle.queue_depth.remote()

    def submit(
        self, replica: Replica, calls: list[Call], producers: list[int], produced: Sequence[Any]
    ) -> list[Any]:
        # Producers' references as arguments: Ray starts the call once they exist and moves the
        # (small) outputs straight between the actors.
        from prismserve.runtime.replica import pickle_calls

        result = replica.handle.invoke.options(num_returns=len(calls)).remote(
            pickle_calls(calls), producers, *produced
        )
        return [result] if len(calls) == 1 else list(result)

    async def result(self, ref: Any) -> Any:
        return await ref

    def cause(self, error: BaseException) -> BaseException:
        from ray.exceptions import RayTaskError

        return error.cause if isinstance(error, RayTaskError) and error.cause is not None else error

    def death(self, error: BaseException, replica: Replica) -> Death | None:
        # A call whose input's producer died fails with a task error that is also an actor error,
        # naming the producer's actor; only an actor error naming this replica's actor is its death.
        from ray.exceptions import RayActorError, RayTaskError

        cause = self.cause(error)
        if not isinstance(cause, RayActorError):
            return None
        if cause.actor_id == replica.actor_id or (
            cause.actor_id is None and not isinstance(error, RayTaskError)
        ):
            return "replica"
        return "input"

    def release(self, replica: Replica, requests: list[str]) -> None:
        with contextlib.suppress(Exception):  # a dead replica has nothing left to release
            replica.handle.release.remote(requests)

    def inventory(self) -> dict[str, float]:
        """GPUs of each alive node; none once the local Ray has lost its GCS or raylet (asking it
        would hold the caller, the event loop, until Ray gives up on its GCS and ends the process)."""
        import ray

        if local_ray_down():
            return {}
        return {n["NodeID"]: n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n["Alive"]}

    def node_names(self) -> dict[str, str]:
        """A node's declared name (a resource `prismserve-node:NAME`), and its address where no
        other node shares it (a topology plan names nodes by their addresses without set-up)."""
        import ray

        nodes = [n for n in ray.nodes() if n["Alive"]]
        addresses = collections.Counter(n["NodeManagerAddress"] for n in nodes)
        names = {
            n["NodeManagerAddress"]: n["NodeID"] for n in nodes if addresses[n["NodeManagerAddress"]] == 1
        }
        for n in nodes:
            names.update(
                {
                    key[len(NODE_RESOURCE) :]: n["NodeID"]
                    for key in n["Resources"]
                    if key.startswith(NODE_RESOURCE)
                }
            )
        return names

    async def reserve(
        self, bundles: list[dict[str, float]], name: str, timeout_s: float, node: str | None = None
    ) -> tuple[Any, str]:
        import ray
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

        if node is not None:  # each bundle takes a token of the resource only that node has
            declared = f"{NODE_RESOURCE}{node}"
            named = any(declared in n["Resources"] for n in ray.nodes() if n["Alive"])
            bundles = [{**b, (declared if named else f"node:{node}"): _PIN} for b in bundles]
        group = placement_group(bundles, strategy="STRICT_PACK", name=name)
        try:
            await asyncio.wait_for(group.ready(), timeout_s)
        except TimeoutError:
            remove_placement_group(group)
            raise
        return group, placement_group_table(group)["bundles_to_node_id"][0]

    def unreserve(self, reservation: Any) -> None:
        from ray.util.placement_group import remove_placement_group

        if not local_ray_down():  # a Ray gone took its placement groups with it
            remove_placement_group(reservation)


class WirePool(RayActorPool):
    """Ray actors for placement and lifecycle; calls, results, stream reads and releases over each
    replica's socket (runtime/wire.py), a round trip of about 0.1 ms instead of a Ray call's 1.1–1.4 ms.

    A consumer's call leaves once its producers' results are here: they are small (payloads stay in
    the producers' slabs), and the gateway needs them for replay anyway.
    """

    async def stop(self, replica: Replica) -> None:
        if replica.address is not None:
            disconnect(replica.address)  # calls still open on it fail as the replica's death
        await super().stop(replica)

    async def queue_depth(self, replica: Replica) -> int:
        return await _client(replica).request("queue_depth")

    def submit(
        self, replica: Replica, calls: list[Call], producers: list[int], produced: Sequence[Any]
    ) -> list[Any]:
        client = _client(replica)
        if not produced:
            return _per_call(client.request("invoke", calls, producers), len(calls))

        async def run() -> Any:
            values = [await ref for ref in produced]  # a producer's failure fails this call too
            return await client.request("invoke", calls, producers, *values)

        return _per_call(asyncio.get_running_loop().create_task(run()), len(calls))

    def cause(self, error: BaseException) -> BaseException:
        return error

    def death(self, error: BaseException, replica: Replica) -> Death | None:
        return _gone(error, replica)

    def release(self, replica: Replica, requests: list[str]) -> None:
        if replica.address is not None:
            connection(replica.address).notify("release", requests)


class InProcessPool(ReplicaPool):
    """Replicas in this process: the replica class Ray runs, called directly, outputs kept local.

    `gpus` declares nodes and their GPUs (default: one node without any) for cells to be placed on.
    """

    _starts = itertools.count()

    def __init__(self, gpus: dict[str, float] | None = None) -> None:
        self._calls: dict[str, set[asyncio.Task[Any]]] = {}
        self._gpus = dict(gpus or {"local": 0.0})
        self._reserved: dict[int, tuple[str, float]] = {}  # id of a reservation -> (node, GPUs)

    async def start(self, manager: TaskManager, replica: Replica) -> None:
        from prismserve.runtime.replica import ExecutorReplica

        refusal = in_process_refusal(type(manager.task)) if manager.spec.backend == "model" else None
        if refusal is not None:
            raise RuntimeError(refusal)
        handle = ExecutorReplica(manager.key, manager.task, manager.spec, 0, in_process=True)
        replica.info = await asyncio.wait_for(handle.start(), manager.start_timeout_s)
        replica.handle = handle
        replica.actor_id = f"local-{next(self._starts)}"
        self._calls[replica.actor_id] = set()

    async def stop(self, replica: Replica) -> None:
        calls = self._calls.pop(replica.actor_id, set())
        for call in calls:
            call.cancel()
        if replica.handle is not None:
            with contextlib.suppress(Exception):
                await replica.handle.stop()

    async def health(self, replica: Replica) -> None:
        if replica.actor_id not in self._calls:
            raise ReplicaGone(replica.actor_id)
        await replica.handle.health()

    async def queue_depth(self, replica: Replica) -> int:
        return replica.handle.queue_depth()

    def submit(
        self, replica: Replica, calls: list[Call], producers: list[int], produced: Sequence[Any]
    ) -> list[Any]:
        loop = asyncio.get_running_loop()
        actor_id, handle = replica.actor_id, replica.handle

        async def run() -> Any:
            values = [await ref for ref in produced]  # a producer's failure fails this call too
            running = self._calls.get(actor_id)
            if running is None:
                raise ReplicaGone(actor_id)
            me = asyncio.current_task()
            assert me is not None  # a coroutine run as a task
            running.add(me)
            try:
                return await handle.invoke(calls, producers, *values)
            except asyncio.CancelledError:
                if actor_id in self._calls:
                    raise
                raise ReplicaGone(actor_id) from None  # stopped under the call
            finally:
                running.discard(me)

        return _per_call(loop.create_task(run()), len(calls))

    async def result(self, ref: Any) -> Any:
        return await ref

    def cause(self, error: BaseException) -> BaseException:
        return error

    def death(self, error: BaseException, replica: Replica) -> Death | None:
        return _gone(error, replica)

    def release(self, replica: Replica, requests: list[str]) -> None:
        if replica.handle is not None:
            replica.handle.release(requests)

    def inventory(self) -> dict[str, float]:
        return dict(self._gpus)

    def node_names(self) -> dict[str, str]:
        return {name: name for name in self._gpus}

    async def reserve(
        self, bundles: list[dict[str, float]], name: str, timeout_s: float, node: str | None = None
    ) -> tuple[Any, str]:
        needed = sum(b.get("GPU", 0.0) for b in bundles)
        free = dict(self._gpus)
        for held, gpus in self._reserved.values():
            free[held] -= gpus
        fits = [n for n, f in free.items() if f >= needed and node in (None, n)]
        if not fits:
            raise TimeoutError(f"no node has {needed} free GPUs")
        reservation = object()
        self._reserved[id(reservation)] = (fits[0], needed)
        return reservation, fits[0]

    def unreserve(self, reservation: Any) -> None:
        self._reserved.pop(id(reservation), None)


def in_process_refusal(task_class: type[UnitTask[Any, Any]]) -> str | None:
    """Why a unit task's real executor cannot run in this process, or None."""
    ref = task_class.executor_ref
    if ref is not None and ref.env:
        return (
            f"{task_class.__qualname__} runs in the {ref.env!r} executor environment, not in "
            "this process: serve it without --in-process (the Ray runtime)"
        )
    return None


def _client(replica: Replica) -> WireClient:
    """This loop's connection to a started replica."""
    if replica.address is None:
        raise ReplicaGone(replica.actor_id)  # never started, or stopped
    return connection(replica.address)


def _gone(error: BaseException, replica: Replica) -> Death | None:
    """Whose death a `ReplicaGone` reports: the call's replica's, or an input's producer's."""
    if not isinstance(error, ReplicaGone):
        return None
    return "replica" if error.actor_id == replica.actor_id else "input"


def _per_call(whole: asyncio.Future[Any], calls: int) -> list[asyncio.Future[Any]]:
    """One result reference per call from the future of a batch's results (a list when several)."""
    refs: list[asyncio.Future[Any]] = [whole]
    if calls > 1:
        refs = [asyncio.ensure_future(_item(whole, i)) for i in range(calls)]
    for ref in refs:
        ref.add_done_callback(_retrieve)
    return refs


async def _item(whole: asyncio.Future[Any], index: int) -> Any:
    return (await whole)[index]


def _retrieve(task: asyncio.Future[Any]) -> None:
    # A result nobody awaits (an abandoned attempt's) must not be logged as never retrieved.
    if not task.cancelled():
        task.exception()
