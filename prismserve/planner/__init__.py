"""Planner: from component profiles to an optimal deployment plan (000 §4, §5.3, Appendices A–C).

Pure Python and HiGHS: usable as a library and as `prismserve plan SPEC --gpus N | --target-rps R`.

    spec = load_spec("docs/examples/qwen25_omni.yaml")
    plan = plan_for_budget(spec, 24)           # or plan_for_target(spec, 30.0)
    plan.routing["image"]                      # {path name: probability}
    change = replan(spec, plan, 60.0)          # change.plan, change.keep / add / remove
"""

from __future__ import annotations

from pydantic import BaseModel

from prismserve.planner.capacity import fixed_replicas_throughput, plan_capacity, spec_at_mix
from prismserve.planner.cells import (
    MAX_PLAN_GPUS,
    Cell,
    budget_mixture,
    check_plan_size,
    greedy_mixture,
    mixture_for_budget,
    mixture_for_target,
    mixture_throughput,
    plan_cells,
    target_gpus_bound,
)
from prismserve.planner.errors import InfeasibleError, PlannerError, SpecError
from prismserve.planner.milp import Solution, check_target, max_throughput, min_gpus, split_paths
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
    DeploymentOption,
    Host,
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


def cell_exponent(spec: PlanSpec, max_exponent: int | None = None) -> int:
    """The largest cell's exponent: the caller's, else the spec's `max_cell_gpus`, else the default."""
    if max_exponent is not None:
        return max_exponent
    if spec.max_cell_gpus is not None:
        return spec.max_cell_gpus.bit_length() - 1
    return DEFAULT_MAX_EXPONENT


def plan_for_budget(spec: PlanSpec, gpus: int, max_exponent: int | None = None) -> Plan:
    """The most throughput for `gpus` GPUs: efficient cells, binary decomposition (plus a cell on
    the leftover GPUs when that does better), path probabilities."""
    model = build_model(spec)
    exponent = cell_exponent(spec, max_exponent)
    cells, mix = budget_mixture(model, plan_cells(model, exponent), gpus)
    plan = make_plan(model, cells, mix, 2**exponent)
    cap = spec.host_capacity()
    if cap is not None and plan.throughput is not None and plan.throughput > cap:
        # The shared CPUs are the bottleneck: more replicas than reach their rate would idle.
        fewer = plan_for_target(spec, cap, max_exponent)
        plan = fewer if fewer.total_gpus <= gpus else plan.model_copy(update={"throughput": cap})
    return plan


def plan_for_target(spec: PlanSpec, rps: float, max_exponent: int | None = None) -> Plan:
    """The fewest GPUs sustaining `rps` requests/s: efficient cells, exact mixture, path probabilities.

    A target needing more than MAX_PLAN_GPUS GPUs is refused (a mistyped rate or profile)."""
    check_target(rps)
    cap = spec.host_capacity()
    if spec.host is not None and cap is not None and rps > cap * (1 + 1e-9):
        raise InfeasibleError(
            f"{rps:g} req/s is beyond what the replicas' shared {spec.host.cpus:g} CPUs sustain "
            f"({cap:.3g} req/s of this mix); ask for less, or run the replicas on GPUs"
        )
    model = build_model(spec)
    exponent = cell_exponent(spec, max_exponent)
    cells = plan_cells(model, exponent)
    check_plan_size(cells, rps, target_gpus_bound(cells, rps))  # cheap: before any mixture
    mix = mixture_for_target(cells, rps)
    check_plan_size(cells, rps, sum(size * count for size, count in mix.items()))
    plan = make_plan(model, cells, mix, 2**exponent)
    if cap is not None and plan.throughput is not None and plan.throughput > cap:
        plan = plan.model_copy(update={"throughput": cap})
    return plan


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


def replan(spec: PlanSpec, current: Plan, rps: float, max_exponent: int | None = None) -> Replan:
    """Re-plan for `rps` req/s (000 §4.3): cells identical to running ones stay up; the rest is added or removed."""
    new = plan_for_target(spec, rps, max_exponent)
    return Replan(plan=new, change=plan_changes(current, new))


__all__ = [
    "DEFAULT_MAX_EXPONENT",
    "MAX_PLAN_GPUS",
    "Cell",
    "CellPlan",
    "DeploymentOption",
    "Host",
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
    "budget_mixture",
    "build_model",
    "cell_exponent",
    "fixed_replicas_throughput",
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
    "plan_capacity",
    "plan_changes",
    "plan_for_budget",
    "plan_for_target",
    "plan_on_topology",
    "replan",
    "route_graph",
    "split_paths",
    "spec_at_mix",
    "topology_plan",
    "valid_paths",
]
