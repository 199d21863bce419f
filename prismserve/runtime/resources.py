"""ResourceManager: the GPU inventory, and cells placed packed on one node (Ray placement groups).

A cell's replicas take whole GPUs, a share of one GPU, or none. Ray spreads fractional bundles of
one placement group over GPU ids as it likes (measured: two 0.5 bundles beside another group's 0.5
landed on GPUs 0 and 1), so replicas with shares do not get bundles of their own: they are packed
first-fit-decreasing into bundles of one whole GPU and scheduled inside them with fractional
`num_gpus`, which puts every replica of such a bundle on that bundle's GPU id.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prismserve.errors import PlacementError
from prismserve.planner import CellPlan, Plan, plan_changes
from prismserve.runtime.pool import ReplicaPool, WirePool
from prismserve.runtime.task_manager import Placement, Replica, TaskManager

_cell_ids = itertools.count()

T = TypeVar("T")

# Shares are decimal fractions (0.3, 0.1): their float sums miss a whole GPU by rounding only.
_SLACK = 1e-9


def first_fit_decreasing(items: list[tuple[T, float]], capacity: float = 1.0) -> list[list[T]]:
    """`items` (thing, size) packed into bins of `capacity`, largest first, each into the first bin
    with room; the bins in order of opening."""
    bins: list[tuple[list[T], float]] = []
    for thing, size in sorted(items, key=lambda item: -item[1]):
        for index, (held, used) in enumerate(bins):
            if used + size <= capacity + _SLACK:
                held.append(thing)
                bins[index] = (held, used + size)
                break
        else:
            bins.append(([thing], size))
    return [held for held, _ in bins]


def cell_bundles(shapes: list[float]) -> tuple[list[dict[str, float]], list[int]]:
    """The bundles of a cell whose replicas need `shapes` GPUs each, and each replica's bundle.

    A replica of whole GPUs gets a bundle of its own, one that needs none a token of CPU; replicas
    with a share of a GPU are packed into bundles of one GPU (their shares sum to at most one).
    """
    bundles: list[dict[str, float]] = []
    index = [0] * len(shapes)
    for i, gpus in enumerate(shapes):
        if gpus == 0 or gpus >= 1:
            index[i] = len(bundles)
            bundles.append({"GPU": gpus} if gpus else {"CPU": 0.001})
    shared = first_fit_decreasing([(i, g) for i, g in enumerate(shapes) if 0 < g < 1])
    for members in shared:
        for i in members:
            index[i] = len(bundles)
        bundles.append({"GPU": 1.0})
    return bundles, index


def _bundle_gpus(bundles: list[dict[str, float]]) -> float:
    return sum(b.get("GPU", 0.0) for b in bundles)


@dataclass(eq=False)
class PlacedCell:
    """A group of replicas on GPUs of one node, deployed and removed as a unit (000 §4.3)."""

    id: int
    owner: str
    gpus: int
    replicas: dict[str, int]  # deployment key -> replicas in this cell
    reserved: float = 0.0  # GPUs its bundles hold (at most `gpus`)
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
                free[cell.node_id] -= cell.reserved
        return free

    async def create_cell(
        self, owner: str, gpus: int, replicas: dict[str, int], managers: dict[str, TaskManager]
    ) -> PlacedCell:
        """Reserve the cell's replicas' resources on one node and start them."""
        members = [managers[key] for key, n in sorted(replicas.items()) for _ in range(n)]
        shapes = [m.task.gpus for m in members]
        bundles, bundle_of = cell_bundles(shapes)
        check_fits(gpus, replicas, shapes, bundles)
        needed = _bundle_gpus(bundles)
        free = self.free_gpus()
        if needed and max(free.values(), default=0) < needed:
            raise PlacementError(
                f"no node has {needed:g} free GPUs for a cell (free GPUs per node: "
                f"[{', '.join(f'{f:g}' for f in sorted(free.values()))}]); add GPUs or plan for fewer"
            )
        cell = PlacedCell(next(_cell_ids), owner, gpus, dict(replicas), reserved=needed)
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
                m.add_replica(Placement(cell.placement_group, bundle_of[i], m.task.gpus, cell.id))
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
        for new in change.add:  # a cell its replicas cannot fit in is refused before anything changes
            shapes = [managers[k].task.gpus for k, n in sorted(new.replicas.items()) for _ in range(n)]
            check_fits(new.gpus, new.replicas, shapes, cell_bundles(shapes)[0])
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


def check_fits(
    gpus: int, replicas: dict[str, int], shapes: list[float], bundles: list[dict[str, float]]
) -> None:
    """Refuse a cell whose replicas need more GPUs than it has: in all, or once their shares of a GPU
    are packed into whole GPUs (three replicas of 0.6 need three)."""
    total = sum(shapes)
    if total > gpus + _SLACK:
        raise PlacementError(
            f"a cell of {gpus} GPUs cannot hold replicas needing {total:g} GPUs: {replicas}; give the "
            "cell more GPUs, or its deployments fewer replicas or smaller shares (`gpus`)"
        )
    needed = _bundle_gpus(bundles)
    if needed > gpus:
        shares = sorted((g for g in shapes if 0 < g < 1), reverse=True)
        raise PlacementError(
            f"a cell of {gpus} GPUs cannot hold replicas {replicas}: their shares of a GPU "
            f"({', '.join(f'{g:g}' for g in shares)}) pack into {needed - sum(g for g in shapes if g >= 1):g} "
            f"whole GPUs beside the replicas of whole GPUs, {needed:g} in all; give the cell more GPUs, "
            "or its deployments shares that fill GPUs together"
        )


def _as_plan(cell: PlacedCell) -> CellPlan:
    return CellPlan(gpus=cell.gpus, replicas=cell.replicas)
