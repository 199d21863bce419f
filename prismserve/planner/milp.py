"""The planner's MILPs (000 §4.3, Appendices A and B), solved with HiGHS.

Variables: integer replicas `r_s` per option, and continuous rates. Appendix B puts a rate
`x[t,p]` on every valid path; the number of paths grows exponentially with the components
(820 for a 6-component Omni spec), so here the rates are flows on the hops of each type's route
graph (`paths.RouteGraph`): a hop's flow is the summed rate of the paths through it, flow is
conserved at every intermediate state, and any such flow splits back into path rates with the
same load on every option. The optimum is the same; `Solution.rates` holds the path rates.

Capacity (Appendix B, eq. 11/14 — eq. 9's product is a typo for this quotient):
`Σ_{t,p} x[t,p] / w[s,t,p] ≤ r_s`, i.e. the seconds of work per second on `s` fit its replicas.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import highspy

from prismserve.planner.errors import InfeasibleError, SpecError
from prismserve.planner.paths import Hop, path_name
from prismserve.planner.throughput import Model

_INF = highspy.kHighsInf


def _swallow_banner() -> None:
    """HiGHS 1.16 prints a banner to the C stdout when a process creates its first instance, before
    any option can turn output off (it broke `prismserve plan --json`): create that instance here,
    at import, with stdout pointed at /dev/null."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


_swallow_banner()
_QUICK_OFF = (
    "mip_heuristic_run_feasibility_jump",
    "mip_heuristic_run_rins",
    "mip_heuristic_run_rens",
    "mip_heuristic_run_root_reduced_cost",
    "mip_allow_restart",
)


@dataclass
class Solution:
    """A deployment: replicas per option and the planned rate of each request type on each path."""

    throughput: float
    replicas: dict[str, int]
    rates: dict[tuple[str, str], float] = field(default_factory=dict)  # (type, path name) -> req/s
    gpus: int = 0
    placement: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> option -> replicas
    entering: dict[str, float] = field(default_factory=dict)  # node -> req/s whose first hop runs there


class _Program:
    """A sparse MILP built row by row, then handed to HiGHS in one piece."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []
        self.starts: list[int] = [0]
        self.index: list[int] = []
        self.value: list[float] = []
        self.h: highspy.Highs | None = None

    def column(self, integer: bool = False, upper: float = _INF) -> int:
        self.cost.append(0.0)
        self.lower.append(0.0)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.cost) - 1

    def row(self, lower: float, upper: float, entries: dict[int, float]) -> None:
        self.row_lower.append(lower)
        self.row_upper.append(upper)
        for col, val in entries.items():
            if val:
                self.index.append(col)
                self.value.append(val)
        self.starts.append(len(self.index))

    def build(self, maximize: bool) -> highspy.Highs:
        lp = highspy.HighsLp()
        lp.num_col_ = len(self.cost)
        lp.num_row_ = len(self.row_lower)
        lp.col_cost_ = self.cost
        lp.col_lower_ = self.lower
        lp.col_upper_ = self.upper
        lp.row_lower_ = self.row_lower
        lp.row_upper_ = self.row_upper
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_ = lp.num_col_
        lp.a_matrix_.num_row_ = lp.num_row_
        lp.a_matrix_.start_ = self.starts
        lp.a_matrix_.index_ = self.index
        lp.a_matrix_.value_ = self.value
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in self.integer
        ]
        lp.sense_ = highspy.ObjSense.kMaximize if maximize else highspy.ObjSense.kMinimize
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("mip_abs_gap", 1e-9)
        # These programs are small (tens of integers) with a tight LP bound: branching closes the gap
        # sooner than sub-MIP heuristics and restarts do (~1.7x faster on the Omni spec). Presolve
        # stays on and the integrality tolerance is tightened: with presolve off, HiGHS 1.15 wrongly
        # proved a zero optimum on one of our random instances (tests/planner/test_milp.py).
        for option in _QUICK_OFF:
            h.setOptionValue(option, False)
        h.setOptionValue("mip_heuristic_effort", 0.0)
        h.setOptionValue("mip_feasibility_tolerance", 1e-9)
        h.passModel(lp)
        self.h = h
        return h

    def solve(self) -> list[float] | None:
        assert self.h is not None
        self.h.run()
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        return list(self.h.getSolution().col_value)

    def restart(self, values: list[float], costs: dict[int, float], maximize: bool) -> None:
        """A new objective on the same constraints, starting from a known feasible solution."""
        assert self.h is not None
        n = len(self.cost)
        full = [costs.get(j, 0.0) for j in range(n)]
        self.h.changeColsCost(n, list(range(n)), full)
        self.h.changeObjectiveSense(highspy.ObjSense.kMaximize if maximize else highspy.ObjSense.kMinimize)
        start = highspy.HighsSolution()
        start.col_value = list(values)
        start.value_valid = True
        self.h.setSolution(start)


def split_paths(
    edges: Sequence[tuple[Hashable, Hashable, str, float]], start: Hashable, end: Hashable, total: float
) -> dict[str, float]:
    """Path rates from hop flows: at each state, split in proportion to the flows leaving it.

    This is 000 Figure 5's reading: per-hop splits (7:3, then 5:2) multiply along a path, and the
    path rates put exactly the planned flow on every hop. `edges` are (source, target, option, flow).
    """
    if total <= 0:
        return {}
    noise = 1e-9 * total  # flows the solver leaves at rounding noise are not routes
    out: dict[Hashable, list[tuple[Hashable, str, float]]] = {}
    for source, target, option, flow in edges:
        if flow > noise:
            out.setdefault(source, []).append((target, option, flow))
    rates: dict[str, float] = {}
    stack: list[tuple[Hashable, float, tuple[str, ...]]] = [(start, 1.0, ())]
    while stack:
        state, probability, names = stack.pop()
        if state == end:
            name = path_name(names)
            rates[name] = rates.get(name, 0.0) + total * probability
            continue
        leaving = out.get(state, [])
        outflow = sum(flow for _, _, flow in leaving)
        for target, option, flow in leaving:
            share = probability * flow / outflow
            if share * total > noise:
                stack.append((target, share, (*names, option)))
    return rates


class _Routes:
    """The no-topology MILP: r_s, then one flow column per hop of every type."""

    def __init__(self, model: Model, budget: int | None, target: float | None) -> None:
        self.model = model
        self.program = p = _Program()
        self.options = [e.name for e in model.spec.deployable_options()]  # solo profiles get no replicas
        self.r = {
            s: p.column(integer=True, upper=budget // model.gpus[s] if budget is not None else _INF)
            for s in self.options
        }
        self.rate = p.column() if target is None else None
        self.flows: dict[str, list[tuple[Hop, int]]] = {}
        load: dict[str, dict[int, float]] = {s: {self.r[s]: -1.0} for s in self.options}
        for request_type in model.spec.request_types:
            graph = model.graphs[request_type.name]
            columns = []
            inflow: dict[int, dict[int, float]] = {}
            for hop in graph.hops:
                col = p.column()
                columns.append((hop, col))
                load[hop.option][col] = model.seconds(hop.option, hop.role, request_type.name)
                inflow.setdefault(hop.target, {})[col] = 1.0
                inflow.setdefault(hop.source, {})[col] = -1.0
            self.flows[request_type.name] = columns
            # Σ flow out of the start = π_t R: the type's rate enters its route graph.
            demand = {col: 1.0 for hop, col in columns if hop.source == graph.start}
            if target is None:
                assert self.rate is not None  # no target: the rate is a column
                demand[self.rate] = -request_type.share
                p.row(0.0, 0.0, demand)
            else:
                p.row(request_type.share * target, request_type.share * target, demand)
            for state, entries in inflow.items():
                if state not in (graph.start, graph.end):
                    p.row(0.0, 0.0, entries)
        for s in self.options:
            p.row(-_INF, 0.0, load[s])
        if budget is not None:
            p.row(-_INF, float(budget), {self.r[s]: float(model.gpus[s]) for s in self.options})

    def gpu_costs(self) -> dict[int, float]:
        return {self.r[s]: float(self.model.gpus[s]) for s in self.options}

    def solution(self, values: list[float], throughput: float) -> Solution:
        replicas = {s: int(round(values[self.r[s]])) for s in self.options}
        rates: dict[tuple[str, str], float] = {}
        for request_type in self.model.spec.request_types:
            graph = self.model.graphs[request_type.name]
            edges = [
                (hop.source, hop.target, hop.option, max(0.0, values[col]))
                for hop, col in self.flows[request_type.name]
            ]
            for name, rate in split_paths(
                edges, graph.start, graph.end, request_type.share * throughput
            ).items():
                rates[(request_type.name, name)] = rate
        gpus = sum(self.model.gpus[s] * n for s, n in replicas.items())
        return Solution(throughput, {s: n for s, n in replicas.items() if n}, rates, gpus)


def max_throughput(model: Model, budget: int) -> Solution:
    """Highest throughput with at most `budget` GPUs (Appendix B), then the fewest GPUs reaching it."""
    routes = _Routes(model, budget, None)
    program, rate = routes.program, routes.rate
    assert rate is not None  # no target: the rate is a column
    program.cost[rate] = 1.0
    program.build(maximize=True)
    values = program.solve()
    if values is None:
        raise InfeasibleError(f"the solver found no deployment for {budget} GPUs")
    best = values[rate]
    if best <= 1e-9:
        return Solution(0.0, {}, {}, 0)
    # Among deployments reaching that throughput, the fewest GPUs: no idle replicas in the plan.
    leanest = _fewest_gpus_at(program, rate, values, best, routes.gpu_costs())
    return routes.solution(leanest, best)


def _fewest_gpus_at(
    program: _Program, rate_col: int, values: list[float], best: float, costs: dict[int, float]
) -> list[float]:
    """Re-solve with R pinned to `best`, minimising GPUs, from the first solve's solution."""
    used = sum(cost * round(values[col]) for col, cost in costs.items())
    h = program.h
    assert h is not None  # built by the first solve
    program.restart(values, costs, maximize=False)
    integers = [j for j, integer in enumerate(program.integer) if integer]
    # R pinned exactly, and if rounding makes that infeasible, a hair below.
    for lower in (best, best * (1 - 1e-9)):
        h.changeColBounds(rate_col, lower, best)
        # The LP relaxation often proves the first solution already uses the fewest GPUs.
        # highspy's stubs ask for a numpy array; its binding converts any sequence.
        h.changeColsIntegrality(len(integers), integers, [highspy.HighsVarType.kContinuous] * len(integers))  # type: ignore[arg-type]
        h.run()
        relaxed = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        bound = h.getInfo().objective_function_value if relaxed else None
        h.changeColsIntegrality(len(integers), integers, [highspy.HighsVarType.kInteger] * len(integers))  # type: ignore[arg-type]
        if bound is not None and math.ceil(bound - 1e-6) >= used:
            return values
        program.restart(values, costs, maximize=False)
        leanest = program.solve()
        if leanest is not None:
            return leanest
    return values


def check_target(target: float) -> None:
    """A SpecError unless `target` is a finite rate above zero."""
    if not (target > 0 and math.isfinite(target)):
        raise SpecError(f"the target throughput must be a finite number > 0 req/s, got {target}")


def fewest_gpus(routes: Any, target: float, infeasible: str) -> Solution:
    """Solve `routes` (rates fixed to `target`) for the fewest GPUs; InfeasibleError(`infeasible`) if none."""
    program = routes.program
    for col, cost in routes.gpu_costs().items():
        program.cost[col] = cost
    program.build(maximize=False)
    values = program.solve()
    if values is None:
        raise InfeasibleError(infeasible)
    return routes.solution(values, target)


def min_gpus(model: Model, target: float) -> Solution:
    """Fewest GPUs sustaining `target` req/s (Appendix B, first variant)."""
    check_target(target)
    return fewest_gpus(_Routes(model, None, target), target, f"no deployment sustains {target:g} req/s")
