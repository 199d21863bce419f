"""The planner's output: cells with replicas, predicted throughput and GPUs, and path probabilities."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel

from prismserve.planner.cells import Cell, mixture_throughput
from prismserve.planner.throughput import Model


class CellPlan(BaseModel):
    """`count` cells of `gpus` GPUs, each running `replicas` and sustaining `throughput` req/s."""

    gpus: int
    throughput: float
    count: int
    replicas: dict[str, int]


class Plan(BaseModel):
    """A deployment plan; `routing[type][path]` is the probability of each whole path (000 §5.3)."""

    gpus: int
    throughput: float
    cells: list[CellPlan]
    routing: dict[str, dict[str, float]]

    def to_json_dict(self) -> dict[str, Any]:
        """The plan as the CLI's JSON."""
        return self.model_dump()


def path_probabilities(model: Model, weighted_rates: list[tuple[float, dict[tuple[str, int], float]]]) -> dict[str, dict[str, float]]:
    """P(path | type) from planned per-path rates, summed over cells weighted by their counts.

    Per-hop splits multiply along a path: a 7:3 split and then 5:2 gives the path through both
    7/10 · 5/7 = 0.5 (000 Figure 5). Summing over the whole mixture keeps every cell at its plan.
    """
    routing: dict[str, dict[str, float]] = {}
    for request_type, paths in model.paths.items():
        totals = [sum(weight * rates.get((request_type, p), 0.0) for weight, rates in weighted_rates) for p in range(len(paths))]
        overall = sum(totals)
        if overall <= 0:
            routing[request_type] = {paths[0].name: 1.0}
            continue
        # Rates the solver leaves at rounding noise are not paths to route to.
        routing[request_type] = {paths[p].name: total / overall for p, total in enumerate(totals) if total > 1e-9 * overall}
    return routing


def make_plan(model: Model, cells: list[Cell], mix: Counter[int]) -> Plan:
    """The plan for a mixture of cells."""
    by_size = {c.gpus: c for c in cells}
    chosen = [(by_size[size], count) for size, count in sorted(mix.items(), reverse=True) if count]
    return Plan(
        gpus=sum(cell.gpus * count for cell, count in chosen),
        throughput=mixture_throughput(cells, mix),
        cells=[
            CellPlan(gpus=cell.gpus, throughput=cell.throughput, count=count, replicas=dict(cell.solution.replicas))
            for cell, count in chosen
        ],
        routing=path_probabilities(model, [(count, cell.solution.rates) for cell, count in chosen]),
    )
