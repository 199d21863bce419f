"""The planner's output: cells with replicas, predicted throughput and GPUs, and path probabilities."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from prismserve.planner.cells import Cell, mixture_throughput
from prismserve.planner.errors import SpecError
from prismserve.planner.milp import Solution
from prismserve.planner.spec import renamed_key
from prismserve.planner.throughput import Model


class CellPlan(BaseModel):
    """`count` cells of `gpus` GPUs, each running `replicas[name]` replicas per deployment and
    sustaining `throughput` req/s (planned; absent from hand-written plans).

    Deployment names are the app's unit-task paths (`prismserve check APP.py` lists them). In a
    topology-aware plan each entry is one node (`node`), and `throughput` is the rate of the
    requests whose first option runs there.
    """

    model_config = ConfigDict(extra="ignore")

    gpus: int = Field(ge=0)
    throughput: float | None = None
    count: int = Field(default=1, ge=0)
    replicas: dict[str, int]
    node: str | None = None

    @model_validator(mode="after")
    def _replicas_not_negative(self) -> CellPlan:
        for name, n in self.replicas.items():
            if n < 0:
                raise ValueError(f"cell replicas[{name!r}] must be >= 0, got {n}")
        return self

    def same_cell(self, other: CellPlan) -> bool:
        """Identical deployments: same size, the same replicas and node (the cell can stay up)."""
        return (
            self.gpus == other.gpus
            and _nonzero(self.replicas) == _nonzero(other.replicas)
            and self.node == other.node
        )


class Plan(BaseModel):
    """A deployment plan: the planner's output, and what the runtime deploys (one model for both).

    `routing[type][path]` is the probability of each whole path (000 §5.3). `profiles` holds, by
    deployment name, the service-time profiles of emulated (`sim`) executors, as the runtime's
    `SimProfile` fields; a plan for real executors has none. A deployment whose task names a real
    engine runs on a `sim` executor only when `emulate` names it too (a twin check, a dry run):
    the runtime refuses its profile otherwise, so no plan turns a real model into a fake by accident. `gpus`, `throughput` and
    `max_cell_gpus` are the planner's figures (absent from hand-written plans).
    """

    model_config = ConfigDict(extra="ignore")

    gpus: int | None = None
    throughput: float | None = None
    max_cell_gpus: int | None = None  # the largest cell size the planner considered (cell plans only)
    cells: list[CellPlan]
    routing: dict[str, dict[str, float]] = Field(default_factory=dict)
    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    emulate: list[str] = Field(default_factory=list)  # real deployments to run on their `profiles`
    # Deployment options by name -> {deployment name: GPUs of its replica}. When given, cells and
    # paths name these options, and the runtime runs each as one replica of every listed deployment.
    options: dict[str, dict[str, float]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _old_options_key(cls, data: Any) -> Any:
        """A plan of an earlier version (a saved `plan.json`) names its options `executors`."""
        return renamed_key(data, "executors", "options")

    @model_validator(mode="after")
    def _routing_sums_to_one(self) -> Plan:
        for request_type, paths in self.routing.items():
            total = sum(paths.values())
            if any(p < 0 for p in paths.values()) or abs(total - 1.0) > 1e-6:
                raise ValueError(f"routing[{request_type!r}] must be probabilities summing to 1, got {paths}")
        return self

    @property
    def total_gpus(self) -> int:
        """GPUs the plan's cells occupy."""
        return sum(cell.gpus * cell.count for cell in self.cells)

    def replicas(self) -> dict[str, int]:
        """Total replicas per deployment name over all cells."""
        totals: dict[str, int] = {}
        for cell in self.cells:
            for name, n in cell.replicas.items():
                totals[name] = totals.get(name, 0) + n * cell.count
        return totals

    def to_json_dict(self) -> dict[str, Any]:
        """The plan as the CLI's JSON: {gpus, throughput, cells: [{gpus, throughput, count, replicas}], routing}."""
        data = self.model_dump()
        for cell in data["cells"]:
            if cell["node"] is None:
                del cell["node"]
        if data["max_cell_gpus"] is None:
            del data["max_cell_gpus"]
        for empty in ("profiles", "emulate", "options"):
            if not data[empty]:
                del data[empty]
        return data


class PlanChange(BaseModel):
    """Moving from one plan to another: cells that stay up, cells to start, cells to stop."""

    keep: list[CellPlan]
    add: list[CellPlan]
    remove: list[CellPlan]


def path_probabilities(
    model: Model, weighted: list[tuple[float, dict[tuple[str, str], float]]]
) -> dict[str, dict[str, float]]:
    """P(path | type) = x[t,p] / Σ_p' x[t,p'], over the whole mixture of cells (000 §5.3, Figure 5).

    `weighted` holds (number of cells, planned path rates of one such cell). Summing over the
    mixture — a request's cell chosen in proportion to its share of the type's rate, then its path
    inside the cell — keeps every cell at its plan. Per-hop splits multiply along a path: a 7:3
    split and then 5:2 gives the path through both 7/10 · 5/7 = 0.5.
    """
    routing: dict[str, dict[str, float]] = {}
    for request_type in model.spec.request_types:
        totals: dict[str, float] = {}
        for weight, rates in weighted:
            for (t, name), rate in rates.items():
                if t == request_type.name and rate > 0:
                    totals[name] = totals.get(name, 0.0) + weight * rate
        overall = sum(totals.values())
        if overall > 0:
            # 12 decimals drop the solver's float noise (0.39999999999999997) and keep sums at 1 ± 1e-11.
            routing[request_type.name] = {name: round(rate / overall, 12) for name, rate in totals.items()}
    return routing


def make_plan(model: Model, cells: list[Cell], mix: Counter[int], max_cell_gpus: int | None = None) -> Plan:
    """The plan for a mixture of cells (size -> count), largest cells first; `max_cell_gpus` is recorded."""
    by_size = {c.gpus: c for c in cells}
    chosen = [(by_size[size], count) for size, count in sorted(mix.items(), reverse=True) if count]
    return Plan(
        # A cell occupies its whole allocation, even when its replicas need fewer GPUs.
        gpus=sum(cell.gpus * count for cell, count in chosen),
        throughput=mixture_throughput(cells, mix),
        max_cell_gpus=max_cell_gpus,
        cells=[
            CellPlan(
                gpus=cell.gpus, throughput=cell.throughput, count=count, replicas=dict(cell.solution.replicas)
            )
            for cell, count in chosen
        ],
        routing=path_probabilities(model, [(count, cell.solution.rates) for cell, count in chosen]),
    )


def topology_plan(model: Model, solution: Solution) -> Plan:
    """A topology-aware solution as a plan: one entry per node that holds replicas."""
    return Plan(
        gpus=solution.gpus,
        throughput=solution.throughput,
        cells=[
            CellPlan(
                gpus=sum(model.gpus[s] * n for s, n in replicas.items()),
                throughput=solution.entering.get(node, 0.0),
                count=1,
                replicas=replicas,
                node=node,
            )
            for node, replicas in solution.placement.items()
        ],
        routing=path_probabilities(model, [(1.0, solution.rates)]),
    )


def plan_changes(current: Plan, new: Plan) -> PlanChange:
    """Which cells of `current` stay up in `new` (identical size and replicas), which to add and remove."""
    remaining = [cell.model_copy() for cell in current.cells]
    keep, add = [], []
    for cell in new.cells:
        wanted = cell.count
        for old in remaining:
            if wanted and old.count and old.same_cell(cell):
                kept = min(wanted, old.count)
                keep.append(cell.model_copy(update={"count": kept}))
                old.count -= kept
                wanted -= kept
        if wanted:
            add.append(cell.model_copy(update={"count": wanted}))
    remove = [old for old in remaining if old.count]
    return PlanChange(keep=keep, add=add, remove=remove)


def load_plan(path: str | Path) -> Plan:
    """Read a plan printed by `prismserve plan --json`."""
    path = Path(path)
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not valid JSON: {exc}") from None
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        where = f"{loc}: " if loc else ""  # a model-wide error (both `options` and `executors`) has none
        message = first["msg"].removeprefix("Value error, ")
        raise SpecError(f"{path}: not a plan (`prismserve plan --json` output): {where}{message}") from None


def _nonzero(replicas: dict[str, int]) -> dict[str, int]:
    return {name: n for name, n in replicas.items() if n}
