"""Planner: from component profiles to an optimal deployment plan (000 §4, §5.3, Appendices A–C).

Pure Python and HiGHS: usable as a library and as `prismserve plan SPEC --gpus N | --target-rps R`.

    spec = load_spec("docs/examples/qwen25_omni.yaml")
    plan = plan_for_budget(spec, 24)           # or plan_for_target(spec, 30.0)
    plan.routing["image"]                      # {path name: probability}
    change = replan(spec, plan, 60.0)          # change.plan, change.keep / add / remove
"""

from __future__ import annotations

from pydantic import BaseModel

from prismserve.planner.cells import (
    Cell,
    greedy_mixture,
    mixture_for_budget,
    mixture_for_target,
    mixture_throughput,
    plan_cells,
)
from prismserve.planner.errors import InfeasibleError, PlannerError, SpecError
from prismserve.planner.milp import Solution, max_throughput, min_gpus, split_paths
from prismserve.planner.paths import Hop, Path, RouteGraph, route_graph, valid_paths
from prismserve.planner.plan import (
    CellPlan,
    Plan,
    PlanChange,
    load_plan,
    make_plan,
    path_probabilities,
    plan_changes,
    topology_plan,
)
from prismserve.planner.spec import (
    ExecutorOption,
    Link,
    Node,
    PlanSpec,
    RequestType,
    Topology,
    load_spec,
    parse_spec,
)
from prismserve.planner.throughput import Model, build_model
from prismserve.planner.topology import max_throughput_on_topology, min_gpus_on_topology

DEFAULT_MAX_EXPONENT = 6  # cells of up to 64 GPUs: a rack-scale domain (000 §4.3)


def plan_for_budget(spec: PlanSpec, gpus: int, max_exponent: int = DEFAULT_MAX_EXPONENT) -> Plan:
    """The most throughput for `gpus` GPUs: efficient cells, binary decomposition, path probabilities."""
    model = build_model(spec)
    cells = plan_cells(model, max_exponent)
    return make_plan(model, cells, mixture_for_budget(cells, gpus))


def plan_for_target(spec: PlanSpec, rps: float, max_exponent: int = DEFAULT_MAX_EXPONENT) -> Plan:
    """The fewest GPUs sustaining `rps` requests/s: efficient cells, exact mixture, path probabilities."""
    model = build_model(spec)
    cells = plan_cells(model, max_exponent)
    return make_plan(model, cells, mixture_for_target(cells, rps))


def plan_on_topology(spec: PlanSpec, gpus: int | None = None, rps: float | None = None) -> Plan:
    """The topology-aware plan on the spec's nodes: most throughput (within `gpus`), or fewest GPUs for `rps`."""
    model = build_model(spec)
    if rps is not None:
        return topology_plan(model, min_gpus_on_topology(model, rps))
    return topology_plan(model, max_throughput_on_topology(model, gpus))


class Replan(BaseModel):
    """A plan for a new target and how to get there from the current one."""

    plan: Plan
    change: PlanChange


def replan(spec: PlanSpec, current: Plan, rps: float, max_exponent: int = DEFAULT_MAX_EXPONENT) -> Replan:
    """Re-plan for `rps` req/s (000 §4.3): cells identical to running ones stay up; the rest is added or removed."""
    new = plan_for_target(spec, rps, max_exponent)
    return Replan(plan=new, change=plan_changes(current, new))


__all__ = [
    "DEFAULT_MAX_EXPONENT",
    "Cell",
    "CellPlan",
    "ExecutorOption",
    "Hop",
    "InfeasibleError",
    "Link",
    "Model",
    "Node",
    "Path",
    "Plan",
    "PlanChange",
    "PlanSpec",
    "PlannerError",
    "Replan",
    "RequestType",
    "RouteGraph",
    "Solution",
    "SpecError",
    "Topology",
    "build_model",
    "greedy_mixture",
    "load_plan",
    "load_spec",
    "make_plan",
    "max_throughput",
    "max_throughput_on_topology",
    "min_gpus",
    "min_gpus_on_topology",
    "mixture_for_budget",
    "mixture_for_target",
    "mixture_throughput",
    "parse_spec",
    "path_probabilities",
    "plan_cells",
    "plan_changes",
    "plan_for_budget",
    "plan_for_target",
    "plan_on_topology",
    "replan",
    "route_graph",
    "split_paths",
    "topology_plan",
    "valid_paths",
]
