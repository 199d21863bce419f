"""Planner: from component profiles to an optimal deployment plan (000 §4, §5.3, Appendices A–C).

Pure Python and HiGHS: usable as a library (`plan_for_budget`, `plan_for_target`) and as
`prismserve plan SPEC --gpus N | --target-rps R`.
"""

from __future__ import annotations

from collections import Counter

from prismserve.planner.cells import (
    Cell,
    greedy_mixture,
    mixture_for_budget,
    mixture_for_target,
    mixture_throughput,
    plan_cells,
    replan,
)
from prismserve.planner.errors import InfeasibleError, PlannerError, SpecError
from prismserve.planner.milp import Solution, max_throughput, max_throughput_on_topology, min_gpus
from prismserve.planner.paths import Path, valid_paths
from prismserve.planner.plan import CellPlan, Plan, make_plan, path_probabilities
from prismserve.planner.spec import ExecutorOption, PlanSpec, RequestType, Topology, load_spec, parse_spec
from prismserve.planner.throughput import Model, build_model

DEFAULT_MAX_EXPONENT = 6  # cells of up to 64 GPUs: a rack-scale domain (000 §4.3)


def plan_for_budget(spec: PlanSpec, gpus: int, max_exponent: int = DEFAULT_MAX_EXPONENT) -> Plan:
    """The most throughput for `gpus` GPUs: efficient cells, binary decomposition, path probabilities."""
    model = build_model(spec)
    cells = plan_cells(model, max_exponent)
    return make_plan(model, cells, mixture_for_budget(cells, gpus))


def plan_for_target(spec: PlanSpec, rps: float, max_exponent: int = DEFAULT_MAX_EXPONENT) -> Plan:
    """The fewest GPUs sustaining `rps` requests/s."""
    model = build_model(spec)
    cells = plan_cells(model, max_exponent)
    return make_plan(model, cells, mixture_for_target(cells, rps))


def replan_for_target(
    spec: PlanSpec, current: Counter[int], rps: float, max_exponent: int = DEFAULT_MAX_EXPONENT
) -> tuple[Plan, Counter[int], Counter[int]]:
    """A plan for a new target that keeps the current mixture's identical cells: (plan, added, removed)."""
    model = build_model(spec)
    cells = plan_cells(model, max_exponent)
    new = mixture_for_target(cells, rps)
    _, added, removed = replan(current, new)
    return make_plan(model, cells, new), added, removed


__all__ = [
    "Cell",
    "CellPlan",
    "ExecutorOption",
    "InfeasibleError",
    "Model",
    "Path",
    "Plan",
    "PlanSpec",
    "PlannerError",
    "RequestType",
    "Solution",
    "SpecError",
    "Topology",
    "build_model",
    "greedy_mixture",
    "load_spec",
    "make_plan",
    "max_throughput",
    "max_throughput_on_topology",
    "min_gpus",
    "mixture_for_budget",
    "mixture_for_target",
    "mixture_throughput",
    "parse_spec",
    "path_probabilities",
    "plan_cells",
    "plan_for_budget",
    "plan_for_target",
    "replan",
    "replan_for_target",
    "valid_paths",
]
