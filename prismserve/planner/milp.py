"""The planner's MILPs (000 §4.3, Appendices A and B), solved with HiGHS.

Variables: integer replicas `r_s` per executor, continuous rates `x[t,p]` per type and path.
Capacity (Appendix B, eq. 11/14 — eq. 9's product is a typo for this quotient):
`Σ_{t,p} x[t,p] / w[s,t,p] ≤ r_s`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import highspy
import numpy as np

from prismserve.planner.errors import InfeasibleError, SpecError
from prismserve.planner.throughput import Model

_INF = highspy.kHighsInf
_EPS = 1e-9


@dataclass
class Solution:
    """A deployment: replicas per executor and the rate of each request type on each of its paths."""

    throughput: float
    replicas: dict[str, int]
    rates: dict[tuple[str, int], float] = field(default_factory=dict)  # (type, path index) -> req/s
    gpus: int = 0
    placement: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> executor -> replicas


class _Program:
    """One MILP over a model: r_s (integer) then x[t,p] columns, optionally R last."""

    def __init__(self, model: Model, with_rate: bool) -> None:
        self.model = model
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("mip_rel_gap", 0.0)
        self.executors = [e.name for e in model.spec.executors]
        self.pairs = [(t, p) for t, paths in model.paths.items() for p in range(len(paths))]
        n = len(self.executors) + len(self.pairs) + (1 if with_rate else 0)
        self.h.addVars(n, np.zeros(n), np.full(n, _INF))
        count = len(self.executors)
        self.h.changeColsIntegrality(count, np.arange(count), np.array([highspy.HighsVarType.kInteger] * count))
        self.rate_col = n - 1 if with_rate else None
        x0 = len(self.executors)
        # capacity: Σ x/w - r_s ≤ 0
        for i, s in enumerate(self.executors):
            cols, vals = [i], [-1.0]
            for j, (t, p) in enumerate(self.pairs):
                seconds = model.work.get((s, t, p), 0.0)
                if seconds:
                    cols.append(x0 + j)
                    vals.append(seconds)
            self.h.addRow(-_INF, 0.0, len(cols), np.array(cols), np.array(vals))

    def demand_rows(self, target: float | None) -> None:
        """Σ_p x[t,p] = π_t R (R fixed to `target`, or the R column)."""
        x0 = len(self.executors)
        for request_type in self.model.spec.request_types:
            cols = [x0 + j for j, (t, _) in enumerate(self.pairs) if t == request_type.name]
            vals = [1.0] * len(cols)
            if target is None:
                cols.append(self.rate_col)
                vals.append(-request_type.share)
                self.h.addRow(0.0, 0.0, len(cols), np.array(cols), np.array(vals))
            else:
                rate = request_type.share * target
                self.h.addRow(rate, rate, len(cols), np.array(cols), np.array(vals))

    def gpu_row(self, lower: float, upper: float) -> None:
        """lower ≤ Σ c_s r_s ≤ upper."""
        gpus = [self.model.spec.executor(s).gpus for s in self.executors]
        self.h.addRow(lower, upper, len(gpus), np.arange(len(gpus)), np.array(gpus, dtype=float))

    def objective(self, costs: dict[int, float], maximize: bool) -> None:
        cols = np.array(list(costs), dtype=np.int32)
        self.h.changeColsCost(len(cols), cols, np.array(list(costs.values())))
        self.h.changeObjectiveSense(highspy.ObjSense.kMaximize if maximize else highspy.ObjSense.kMinimize)

    def solve(self) -> list[float] | None:
        self.h.run()
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        return list(self.h.getSolution().col_value)

    def solution(self, values: list[float], throughput: float) -> Solution:
        replicas = {s: int(round(values[i])) for i, s in enumerate(self.executors)}
        x0 = len(self.executors)
        rates = {pair: max(0.0, values[x0 + j]) for j, pair in enumerate(self.pairs)}
        gpus = sum(self.model.spec.executor(s).gpus * n for s, n in replicas.items())
        return Solution(throughput, {s: n for s, n in replicas.items() if n}, rates, gpus)


def max_throughput(model: Model, budget: int) -> Solution:
    """Highest throughput with at most `budget` GPUs (Appendix B), then the fewest GPUs reaching it."""
    program = _Program(model, with_rate=True)
    program.demand_rows(None)
    program.gpu_row(-_INF, budget)
    program.objective({program.rate_col: 1.0}, maximize=True)
    values = program.solve()
    if values is None:
        raise InfeasibleError(f"the solver found no deployment for {budget} GPUs")
    best = values[program.rate_col]
    if best <= _EPS:
        return Solution(0.0, {}, {}, 0)
    # Among deployments reaching that throughput, use the fewest GPUs (the first is a feasible start).
    leanest = min_gpus(model, best * (1 - 1e-9), start=values[: program.rate_col])
    leanest.throughput = best
    return leanest


def min_gpus(model: Model, target: float, start: list[float] | None = None) -> Solution:
    """Fewest GPUs sustaining `target` req/s (Appendix B, first variant); `start` is a known solution."""
    if not target > 0:
        raise SpecError(f"the target throughput must be > 0 req/s, got {target}")
    program = _Program(model, with_rate=False)
    program.demand_rows(target)
    program.objective({i: float(model.spec.executor(s).gpus) for i, s in enumerate(program.executors)}, maximize=False)
    if start is not None:
        initial = highspy.HighsSolution()
        initial.col_value = list(start)
        initial.value_valid = True
        program.h.setSolution(initial)
    values = program.solve()
    if values is None:
        raise InfeasibleError(f"no deployment sustains {target:g} req/s")
    return program.solution(values, target)


def max_throughput_on_topology(model: Model) -> Solution:
    """Highest throughput on the spec's nodes with their bandwidth (the topology-aware MILP, Appendix A).

    Appendix A's flows `f` are not tied to where replicas run, which makes its bandwidth constraint
    vacuous. Here each path's rate is split over assignments of its executors to nodes: the work of
    executor s on node h is bounded by its replicas there, GPUs by each node's, and the bytes sent
    between executors on different nodes by the bandwidth of that node pair.
    """
    topology = model.spec.topology
    if topology is None:
        raise SpecError("topology-aware planning needs a `topology` section in the spec")
    nodes = [n.name for n in topology.nodes]
    executors = [e.name for e in model.spec.executors]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    y = {(s, n): k for k, (s, n) in enumerate(itertools.product(executors, nodes))}
    columns: list[tuple[str, int, tuple[str, ...]]] = []
    for t, paths in model.paths.items():
        for p, path in enumerate(paths):
            columns.extend((t, p, a) for a in itertools.product(nodes, repeat=len(path.executors)))
    n_cols = len(y) + len(columns) + 1
    rate = n_cols - 1
    h.addVars(n_cols, np.zeros(n_cols), np.full(n_cols, _INF))
    h.changeColsIntegrality(len(y), np.arange(len(y)), np.array([highspy.HighsVarType.kInteger] * len(y)))
    x0 = len(y)
    for request_type in model.spec.request_types:
        cols = [x0 + j for j, (t, _, _) in enumerate(columns) if t == request_type.name] + [rate]
        vals = [1.0] * (len(cols) - 1) + [-request_type.share]
        h.addRow(0.0, 0.0, len(cols), np.array(cols), np.array(vals))
    for (s, node), k in y.items():
        cols, vals = [k], [-1.0]
        for j, (t, p, assignment) in enumerate(columns):
            path = model.paths[t][p]
            if s in path.executors and assignment[path.executors.index(s)] == node:
                cols.append(x0 + j)
                vals.append(model.work.get((s, t, p), 0.0))
        h.addRow(-_INF, 0.0, len(cols), np.array(cols), np.array(vals))
    for node in topology.nodes:
        cols = [y[(s, node.name)] for s in executors]
        vals = [float(model.spec.executor(s).gpus) for s in executors]
        h.addRow(-_INF, node.gpus, len(cols), np.array(cols), np.array(vals))
    for a, b in itertools.combinations(nodes, 2):
        cols, vals = [], []
        for j, (t, p, assignment) in enumerate(columns):
            path = model.paths[t][p].executors
            sent = sum(
                topology.edge_bytes.get(f"{path[i]}->{path[i + 1]}", 0.0)
                for i in range(len(path) - 1)
                if {assignment[i], assignment[i + 1]} == {a, b}
            )
            if sent:
                cols.append(x0 + j)
                vals.append(sent)
        if cols:
            h.addRow(-_INF, topology.bandwidth, len(cols), np.array(cols), np.array(vals))
    h.changeColsCost(1, np.array([rate]), np.array([1.0]))
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise InfeasibleError("the topology-aware problem has no solution")
    values = list(h.getSolution().col_value)
    replicas: dict[str, int] = {}
    placement: dict[str, dict[str, int]] = {}
    for (s, node), k in y.items():
        count = int(round(values[k]))
        if count:
            replicas[s] = replicas.get(s, 0) + count
            placement.setdefault(node, {})[s] = count
    rates: dict[tuple[str, int], float] = {}
    for j, (t, p, _) in enumerate(columns):
        rates[(t, p)] = rates.get((t, p), 0.0) + max(0.0, values[x0 + j])
    gpus = sum(model.spec.executor(s).gpus * n for s, n in replicas.items())
    return Solution(values[rate], replicas, rates, gpus, placement)


def ceil_div(a: float, b: float) -> int:
    """⌈a / b⌉ for positive b, robust to float noise."""
    return max(0, math.ceil(a / b - 1e-9))
