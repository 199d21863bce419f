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
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prismserve.errors import PlacementError
from prismserve.planner import CellPlan, Plan, plan_changes
from prismserve.runtime.pool import ReplicaPool, WirePool
from prismserve.runtime.task_manager import Placement, Replica, TaskManager, next_era

log = logging.getLogger(__name__)

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


def _listed(replicas: dict[str, int]) -> str:
    """`replicas` for a message: "a, 2 x b"."""
    return ", ".join(key if n == 1 else f"{n} x {key}" for key, n in sorted(replicas.items()))


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
    node: str | None = None  # the name a plan pinned it to
    members: list[tuple[TaskManager, Replica]] = field(default_factory=list)


class ResourceManager:
    """Places cells on the cluster's GPUs and applies new plans by changing only what differs.

    Reservations go through the replica pool (Ray placement groups by default). A cell a new plan
    drops is drained before it is removed (requests on it finish first), for as long as requests on
    it keep finishing: at most `drain_timeout_s` without one finishing.
    """

    DRAIN_POLL_S = 0.05  # how often a draining cell is looked at: a request takes far longer
    # How long a new plan's cell may take to place before the old cells are drained: GPUs that are free
    # by this runtime's count may still be held in the cluster (another job, or a placement group Ray
    # has not yet released); the cell then starts after the drain, as one that did not fit.
    EARLY_PLACE_S = 10.0

    def __init__(
        self, place_timeout_s: float = 60.0, pool: ReplicaPool | None = None, drain_timeout_s: float = 120.0
    ) -> None:
        self.cells: list[PlacedCell] = []
        self.place_timeout_s = place_timeout_s
        self.pool = pool or WirePool()
        self.drain_timeout_s = drain_timeout_s
        self._applying = asyncio.Lock()  # one plan change at a time
        self._placing = 0.0  # GPUs of cells being reserved now (on a node not known yet)
        self._homeless: list[PlacedCell] = []  # cells of lost nodes not re-placed yet

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

    def shortage(self, owner: str, cells: list[CellPlan]) -> PlacementError | None:
        """Why `cells` (an app's first, placed at once) cannot all be placed on the GPUs free now,
        naming what each needs; None when they may be. Said at once rather than after a placement
        timeout."""
        needed = sum(cell.gpus for cell in cells)
        free = self.free_gpus()
        if needed <= sum(free.values()) + _SLACK:
            return None
        parts = ", ".join(f"{_listed(cell.replicas)}: {cell.gpus:g}" for cell in cells if cell.gpus)
        return PlacementError(
            f"app {owner!r} needs {needed:g} GPUs for one replica of each deployment ({parts}); the "
            f"cluster has {sum(free.values()):g} free: add GPUs (--fake-gpus N declares them on a machine "
            "without), give deployments shares of a GPU (a task's `gpus`), or post a plan that places "
            "them together"
        )

    async def create_cell(
        self,
        owner: str,
        gpus: int,
        replicas: dict[str, int],
        managers: dict[str, TaskManager],
        place_timeout_s: float | None = None,
        node: str | None = None,
    ) -> PlacedCell:
        """Reserve the cell's replicas' resources on one node (the one named `node`, if given;
        waiting at most `place_timeout_s`, default the manager's) and start them."""
        members = [managers[key] for key, n in sorted(replicas.items()) for _ in range(n)]
        shapes = [m.task.gpus for m in members]
        bundles, bundle_of = cell_bundles(shapes)
        check_fits(gpus, replicas, shapes, bundles)
        needed = _bundle_gpus(bundles)
        free = self.free_gpus()
        on_node = free.get(self._node_id(node), 0.0) if node is not None else None
        if on_node is not None and needed > on_node + _SLACK:
            raise PlacementError(
                f"node {node!r} has {on_node:g} free GPUs, not the {needed:g} a cell of "
                f"{_listed(replicas)} pinned to it needs; free them or pin the cell elsewhere"
            )
        # Cells placed at once (an app's first cells) each see the others' GPUs as free until placed.
        if (
            on_node is None
            and needed
            and (max(free.values(), default=0) < needed or sum(free.values()) - self._placing < needed)
        ):
            placing = f", {self._placing:g} of them taken by cells starting now" if self._placing else ""
            raise PlacementError(
                f"no node has {needed:g} free GPUs for a cell of {_listed(replicas)} (free GPUs per node: "
                f"[{', '.join(f'{f:g}' for f in sorted(free.values()))}]{placing}); add GPUs or plan for fewer"
            )
        cell = PlacedCell(next(_cell_ids), owner, gpus, dict(replicas), reserved=needed, node=node)
        timeout_s = self.place_timeout_s if place_timeout_s is None else place_timeout_s
        self._placing += needed
        try:
            cell.placement_group, cell.node_id = await self.pool.reserve(
                bundles, f"prismserve-cell-{cell.id}", timeout_s, node
            )
        except TimeoutError:
            raise PlacementError(
                f"cell of {needed:g} GPUs could not be placed within {timeout_s:.0f} s: the cluster holds "
                "GPUs this runtime did not take (another job or runtime on it?); free them or plan for fewer"
            ) from None
        finally:
            self._placing -= needed
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

    def _node_id(self, node: str) -> str:
        """The node a plan's `node` names; refused with the names known when none."""
        names = self.pool.node_names()
        if node not in names:
            raise PlacementError(
                f"plan pins a cell to node {node!r}, which the cluster does not have; it has "
                f"{sorted(names)}. Name a node at its start (ray start --resources "
                f"'{{\"prismserve-node:{node}\": 1}}') or pin cells by node address"
            )
        return names[node]

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
        self,
        owner: str,
        desired: list[CellPlan],
        managers: dict[str, TaskManager],
        switch: Callable[[], None] | None = None,
    ) -> tuple[int, int]:
        """Make `owner`'s cells match `desired` (replicas by deployment key) with the planner's plan diff
        (`plan_changes`) without failing a request: identical cells stay up; the cells to add that fit
        in free GPUs start first (if they can be placed within `EARLY_PLACE_S`); a dropped cell that
        an added one can replace in place (`Reshape`) keeps the replicas both have; then `switch`
        sends new requests along the new plan; then the cells to remove are drained (`drain_cell`)
        and removed, and the reshaped cells' replicas that go are drained and replaced; then the
        other new cells start on the GPUs freed. Until those are up, their deployments' leases wait
        for them (`TaskManager.expect`) rather than fail.

        Returns (cells added, cells removed).
        """
        async with self._applying:
            owned = [c for c in self.cells if c.owner == owner]
            change = plan_changes(Plan(cells=[_as_plan(c) for c in owned]), Plan(cells=desired))
            for new in change.add:  # a cell that cannot be placed is refused before anything changes
                check_fits(
                    new.gpus, new.replicas, _shapes(new.replicas, managers), _bundles(new.replicas, managers)
                )
                if new.node is not None:
                    self._node_id(new.node)
            removed: list[PlacedCell] = []
            for gone in change.remove:  # of identical cells, the least used go (their drains are shortest)
                matching = [c for c in owned if c not in removed and _as_plan(c).same_cell(gone)]
                removed += sorted(matching, key=_in_use)[: gone.count]
            added = [
                new.model_copy(update={"replicas": {k: n for k, n in new.replicas.items() if n}, "count": 1})
                for new in change.add
                for _ in range(new.count)
            ]
            later = [new for new in added if not await self._start_early(owner, new, managers)]
            reshapes = _reshapes(removed, later, managers)
            for reshape in reshapes:  # in place: their replicas kept serve throughout
                removed.remove(reshape.cell)
                later.remove(reshape.new)
                for manager, _ in reshape.coming:
                    manager.expect(1)
            for new in later:
                _expect(managers, new.replicas, 1)
            try:
                if switch is not None:
                    switch()
                era = next_era()  # no await since the switch: requests begun after it are of this era
                await asyncio.gather(
                    *(self.drain_cell(cell, era=era) for cell in removed),
                    *(self._reshape(reshape, era) for reshape in reshapes),
                )
                while later:
                    new = later.pop(0)
                    try:
                        await self.create_cell(owner, new.gpus, new.replicas, managers, node=new.node)
                    finally:
                        _expect(managers, new.replicas, -1)
            finally:
                for new in later:  # not started (an earlier one failed): leases stop waiting
                    _expect(managers, new.replicas, -1)
            return len(added), len(removed) + len(reshapes)

    async def _start_early(self, owner: str, new: CellPlan, managers: dict[str, TaskManager]) -> bool:
        """Start a new plan's cell before the old cells go, if some node (its own, when pinned) has
        the GPUs for it now (`create_cell` refuses it otherwise); returns whether it started."""
        timeout_s = min(self.EARLY_PLACE_S, self.place_timeout_s)
        try:
            await self.create_cell(owner, new.gpus, new.replicas, managers, timeout_s, new.node)
        except PlacementError as exc:
            log.info("a new cell of %s starts after the old cells drain: %s", owner, exc)
            return False
        return True

    async def drain_cell(
        self, cell: PlacedCell, timeout_s: float | None = None, era: int | None = None
    ) -> bool:
        """Remove a cell without failing the requests on it: its replicas take no new leases (while
        others can; requests begun before the switch of `era`, default now, go on there while
        replicas expected are not up), and it is removed once no request in flight uses them (no
        lease held, no open request whose payloads or streams are there). A cell whose requests stop
        finishing for `timeout_s` (`drain_timeout_s`) is removed anyway (logged): under sustained
        overload a long queue drains as long as it moves. Returns whether it drained."""
        busy = await self._drain(
            [r for _, r in cell.members], f"cell {cell.id} of {cell.owner}", timeout_s, era
        )
        await self.remove_cell(cell)
        return not busy

    async def _drain(
        self, replicas: list[Replica], what: str, timeout_s: float | None = None, era: int | None = None
    ) -> list[Replica]:
        """Drain `replicas` (see `drain_cell`); returns those still busy when their requests stopped
        finishing."""
        era = next_era() if era is None else era
        for replica in replicas:
            replica.drain(era)
        loop = asyncio.get_running_loop()
        patience = self.drain_timeout_s if timeout_s is None else timeout_s
        deadline, left = loop.time() + patience, _load(replicas)
        while left and loop.time() < deadline:
            await asyncio.sleep(self.DRAIN_POLL_S)
            now_left = _load(replicas)
            if now_left < left:  # a request finished: the drain moves
                deadline = loop.time() + patience
            left = now_left
        busy = [r for r in replicas if r.in_flight or r.users]
        if busy:
            log.warning(
                "%s stopped draining (no request finished for %.0f s): removing it with %d calls and "
                "%d requests on it",
                what,
                patience,
                sum(r.in_flight for r in busy),
                sum(r.users for r in busy),
            )
        return busy

    async def _reshape(self, change: Reshape, era: int) -> None:
        """Turn a dropped cell into an added one in place: drain and stop the replicas the new cell
        does not keep, then start the new ones in their bundles; the others serve throughout."""
        going = [replica for _, replica in change.going]
        await self._drain(
            going, f"{len(going)} replicas of cell {change.cell.id} of {change.cell.owner}", era=era
        )
        await asyncio.gather(*(manager.remove_replica(replica) for manager, replica in change.going))
        cell = change.cell
        cell.members = [(m, r) for m, r in cell.members if r not in going]
        cell.replicas = dict(change.new.replicas)
        try:
            started = await asyncio.gather(
                *(
                    manager.add_replica(Placement(cell.placement_group, bundle, manager.task.gpus, cell.id))
                    for manager, bundle in change.coming
                ),
                return_exceptions=True,
            )
        finally:
            for manager, _ in change.coming:
                manager.expect(-1)
        cell.members += [
            (m, r) for (m, _), r in zip(change.coming, started, strict=True) if isinstance(r, Replica)
        ]
        errors = [r for r in started if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def replace_lost(self, managers: dict[str, TaskManager]) -> int:
        """Re-place the cells of nodes that left the cluster (their replicas died with the node) on
        nodes with room, any pin dropped: the node it named is gone. Until they are up, their
        deployments' leases wait for them; a cell that finds no room is tried again at the next
        call. Returns how many cells were re-placed."""
        alive = self.inventory()
        lost = [c for c in self.cells if c.node_id and c.node_id not in alive]
        if not lost and not self._homeless:
            return 0
        async with self._applying:
            for cell in lost:
                log.warning(
                    "node %s of cell %d of %s left the cluster: re-placing %s",
                    cell.node or cell.node_id,
                    cell.id,
                    cell.owner,
                    _listed(cell.replicas),
                )
                _expect(managers, cell.replicas, 1)
                await self.remove_cell(cell)
                self._homeless.append(cell)
            placed = 0
            for cell in list(self._homeless):
                try:
                    await self.create_cell(cell.owner, cell.gpus, cell.replicas, managers, self.EARLY_PLACE_S)
                except PlacementError as exc:
                    log.warning("cell %d of %s waits for room: %s", cell.id, cell.owner, exc)
                    continue
                finally:
                    _expect(managers, cell.replicas, -1)
                self._homeless.remove(cell)
                placed += 1
            for cell in self._homeless:  # still waiting: leases keep waiting for them
                _expect(managers, cell.replicas, 1)
            return placed

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
    return CellPlan(gpus=cell.gpus, replicas=cell.replicas, node=cell.node)


def _shapes(replicas: dict[str, int], managers: dict[str, TaskManager]) -> list[float]:
    """GPUs of each replica of a cell holding `replicas` (by deployment key)."""
    return [managers[k].task.gpus for k, n in sorted(replicas.items()) for _ in range(n)]


def _bundles(replicas: dict[str, int], managers: dict[str, TaskManager]) -> list[dict[str, float]]:
    return cell_bundles(_shapes(replicas, managers))[0]


def _expect(managers: dict[str, TaskManager], replicas: dict[str, int], sign: int) -> None:
    """Announce (1) or withdraw (-1) a cell's replicas to their task managers."""
    for key, n in replicas.items():
        if key in managers:  # a deployment unregistered meanwhile has nobody waiting
            managers[key].expect(sign * n)


@dataclass
class Reshape:
    """A dropped cell turned into an added one in place: same GPUs and node, and replicas of the
    same whole-GPU shapes, so each replica that goes leaves a bundle that one that comes fits.
    The replicas both cells have stay up: a plan change drains single replicas, not the cell."""

    cell: PlacedCell
    new: CellPlan
    going: list[tuple[TaskManager, Replica]]
    coming: list[tuple[TaskManager, int]]  # each new replica's manager and bundle


def _reshapes(
    removed: list[PlacedCell], added: list[CellPlan], managers: dict[str, TaskManager]
) -> list[Reshape]:
    """Pairs of a dropped and an added cell that can change in place (`Reshape`)."""
    found: list[Reshape] = []
    for new in added:
        for old in removed:
            if all(change.cell is not old for change in found) and (change := _reshape(old, new, managers)):
                found.append(change)
                break
    return found


def _reshape(old: PlacedCell, new: CellPlan, managers: dict[str, TaskManager]) -> Reshape | None:
    old_shapes, new_shapes = _shapes(old.replicas, managers), _shapes(new.replicas, managers)
    if old.gpus != new.gpus or old.node != new.node or sorted(old_shapes) != sorted(new_shapes):
        return None
    if any(0 < g < 1 for g in old_shapes):  # shares packed into one bundle: no bundle is freed alone
        return None
    going = []
    for key, n in old.replicas.items():
        extra = n - new.replicas.get(key, 0)
        if extra <= 0:
            continue
        members = sorted([(m, r) for m, r in old.members if m.key == key], key=lambda mr: _load([mr[1]]))
        if len(members) < extra:  # one failed to start: the cell is replaced whole
            return None
        going += members[:extra]
    freed = [(replica.placement.gpus, replica.placement.bundle_index) for _, replica in going]
    coming = []
    for key, n in new.replicas.items():
        for _ in range(n - old.replicas.get(key, 0)):
            gpus = managers[key].task.gpus
            slot = next(i for i, (shape, _) in enumerate(freed) if shape == gpus)
            coming.append((managers[key], freed.pop(slot)[1]))
    return Reshape(old, new, going, coming)


def _load(replicas: list[Replica]) -> int:
    """Calls in flight and open requests on `replicas`."""
    return sum(r.in_flight + r.users for r in replicas)


def _in_use(cell: PlacedCell) -> int:
    """Calls in flight and open requests on the cell's replicas."""
    return _load([r for _, r in cell.members])
