"""ReplicaPool: how a deployment's replicas are started, asked and stopped.

The task manager owns the bookkeeping (health, restarts, leases, picks) and leaves the mechanics
to a pool: Ray actors in a cell's placement-group bundle in production, a fake in unit tests, so
that the control plane's logic is tested without a cluster.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prismserve.runtime.task_manager import Replica, TaskManager


class ReplicaPool(ABC):
    """Starts, health-checks and stops the replicas of task managers."""

    @abstractmethod
    async def start(self, manager: TaskManager, replica: Replica) -> None:
        """Start `replica` of `manager`'s deployment and load its executor; sets `handle`, `info`
        and `actor_id`. Raises asyncio.TimeoutError after `manager.start_timeout_s`."""

    @abstractmethod
    async def stop(self, replica: Replica) -> None:
        """Stop `replica`'s process; never raises (a dead replica is already stopped)."""

    @abstractmethod
    async def health(self, replica: Replica) -> None:
        """Raise if the replica cannot serve."""

    @abstractmethod
    async def queue_depth(self, replica: Replica) -> int:
        """Invocations running or waiting on the replica, as the replica counts them."""


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
        replica.info = await asyncio.wait_for(replica.handle.start.remote(), manager.start_timeout_s)
        replica.actor_id = replica.info.get("actor_id", "")

    async def stop(self, replica: Replica) -> None:
        handle = replica.handle
        if handle is None:
            return
        import ray

        try:
            await asyncio.wait_for(handle.stop.remote(), 5)
        except Exception:  # noqa: BLE001 - already dead or stuck: killing is what matters
            pass
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001
            pass

    async def health(self, replica: Replica) -> None:
        await replica.handle.health.remote()

    async def queue_depth(self, replica: Replica) -> int:
        return await replica.handle.queue_depth.remote()

