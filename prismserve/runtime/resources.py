"""ResourceManager: the GPU inventory, and cells placed packed on one node (Ray placement groups)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from prismserve.errors import PlacementError
from prismserve.planner import CellPlan, Plan, plan_changes
from prismserve.runtime.pool import ReplicaPool, WirePool
from prismserve.runtime.task_manager import Placement, Replica, TaskManager

_cell_ids = itertools.count()


@dataclass(eq=False)
class PlacedCell:
    """A group of replicas on GPUs of one node, deployed and removed as a unit (000 §4.3)."""

    id: int
    owner: str
    gpus: int
    replicas: dict[str, int]  # deployment key -> replicas in this cell
    placement_group: Any = None
    node_id: str = ""
    members: list[tuple[TaskManager, Replica]] = field(default_factory=list)


class ResourceManager:
    """Places cells on the cluster's GPUs and applies new plans by changing only what differs.

    Reservations go through the replica pool (Ray placement groups by default).
    """

    def __init__(self, place_timeout_s: float = 60.0, pool: ReplicaPool | None = None) -> None:
        self.cells: list[PlacedCell] = []
        self.place_timeout_s = place_timeout_s
        self.pool = pool or WirePool()

    def inventory(self) -> dict[str, float]:
        """GPUs of each alive node (real or declared)."""
        return self.pool.inventory()

    def free_gpus(self) -> dict[str, float]:
        """GPUs of each node not taken by a cell."""
        free = self.inventory()
        for cell in self.cells:
            if cell.node_id in free:
                free[cell.node_id] -= sum(r.placement.gpus for _, r in cell.members)
        return free

    async def create_cell(
        self, owner: str, gpus: int, replicas: dict[str, int], managers: dict[str, TaskManager]
    ) -> PlacedCell:
        """Reserve the cell's replicas' resources on one node and start them."""
        members = [managers[key] for key, n in sorted(replicas.items()) for _ in range(n)]
        needed = sum(m.task.gpus for m in members)
        if needed > gpus:
            raise PlacementError(
                f"a cell of {gpus} GPUs cannot hold replicas needing {needed:g} GPUs: {replicas}"
            )
        free = self.free_gpus()
        if needed and max(free.values(), default=0) < needed:
            raise PlacementError(
                f"no node has {needed:g} free GPUs for a cell (free GPUs per node: "
                f"[{', '.join(f'{f:g}' for f in sorted(free.values()))}]); add GPUs or plan for fewer"
            )
        bundles: list[dict[str, float]] = [
            {"GPU": m.task.gpus} if m.task.gpus else {"CPU": 0.001} for m in members
        ]
        cell = PlacedCell(next(_cell_ids), owner, gpus, dict(replicas))
        try:
            cell.placement_group, cell.node_id = await self.pool.reserve(
                bundles, f"prismserve-cell-{cell.id}", self.place_timeout_s
            )
        except TimeoutError:
            raise PlacementError(
                f"cell of {needed:g} GPUs could not be placed within {self.place_timeout_s:.0f} s"
            ) from None
        self.cells.append(cell)
        started = await asyncio.gather(
            *(
                m.add_replica(Placement(cell.placement_group, i, m.task.gpus, cell.id))
                for i, m in enumerate(members)
            ),
            return_exceptions=True,
        )
        cell.members = [(m, r) for m, r in zip(members, started, strict=True) if isinstance(r, Replica)]
        errors = [r for r in started if isinstance(r, BaseException)]
        if errors:
            await self.remove_cell(cell)
            raise errors[0]
        return cell

    async def remove_cell(self, cell: PlacedCell) -> None:
        """Stop the cell's replicas and give its GPUs back."""
        await asyncio.gather(*(manager.remove_replica(replica) for manager, replica in cell.members))
        # A replica that failed to start is still listed by its manager.
        for manager in {m for m, _ in cell.members}:
            for replica in [
                r for r in manager.replicas if r.placement.placement_group is cell.placement_group
            ]:
                await manager.remove_replica(replica)
        if cell.placement_group is not None:
            self.pool.unreserve(cell.placement_group)
        if cell in self.cells:
            self.cells.remove(cell)

    async def apply(
        self, owner: str, desired: list[CellPlan], managers: dict[str, TaskManager]
    ) -> tuple[int, int]:
        """Make `owner`'s cells match `desired` (replicas by deployment key) with the planner's plan diff
        (`plan_changes`): identical cells stay up, the rest are added and removed.

        Returns (cells added, cells removed).
        """
        owned = [c for c in self.cells if c.owner == owner]
        change = plan_changes(Plan(cells=[_as_plan(c) for c in owned]), Plan(cells=desired))
        removed: list[PlacedCell] = []
        for gone in change.remove:
            matching = [c for c in owned if c not in removed and _as_plan(c).same_cell(gone)]
            removed += matching[: gone.count]
        for cell in removed:
            await self.remove_cell(cell)
        added = [new for new in change.add for _ in range(new.count)]
        for new in added:
            await self.create_cell(owner, new.gpus, {k: n for k, n in new.replicas.items() if n}, managers)
        return len(added), len(removed)

    async def close(self) -> None:
        """Remove every cell."""
        for cell in list(self.cells):
            await self.remove_cell(cell)


def _as_plan(cell: PlacedCell) -> CellPlan:
    return CellPlan(gpus=cell.gpus, replicas=cell.replicas)
