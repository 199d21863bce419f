"""The topology-aware MILP (000 Appendix A): replicas per node, node GPUs and link bandwidth.

Appendix A's flows `f[s,s',h,h']` are tied to option edges but not to where the replicas of
`s` and `s'` run, so its bandwidth constraint never binds: any traffic can be booked on a pair
of nodes that holds neither option. Here the rates carry their placement. Each type's route
graph (`paths.RouteGraph`) is expanded over nodes: a flow column is a hop run on node `h` after
the previous hop ran option `s'` on node `h'`. Then

- work of option `s` on node `h` ≤ its replicas there, `y[s,h]` (Appendix A eq. 5, per node);
- GPUs of node `h`: `Σ_s c_s y[s,h] ≤ |G_h|` (eq. 6);
- bytes sent from node `h'` to node `h`: `Σ b[s',s] · flow ≤ B[h',h]` (eqs. 7–8), with `b[s',s]`
  the spec's `edge_bytes["s'->s"]` and `B` per direction.

Columns grow as hops × (options × nodes) × nodes: meant for small clusters.
"""

from __future__ import annotations

from prismserve.planner.errors import InfeasibleError, SpecError
from prismserve.planner.milp import (
    _INF,
    Solution,
    _fewest_gpus_at,
    _Program,
    check_target,
    fewest_gpus,
    split_paths,
)
from prismserve.planner.paths import Hop
from prismserve.planner.throughput import Model


class _Placed:
    """The expanded MILP: y[s,h] integer, then one flow column per (type, hop, previous hop's place, node)."""

    def __init__(self, model: Model, budget: int | None, target: float | None) -> None:
        topology = model.spec.topology
        if topology is None:
            raise SpecError(
                "topology-aware planning needs a `topology` section in the spec (nodes, bandwidth)"
            )
        self.model = model
        self.nodes = [n.name for n in topology.nodes]
        capacity = {n.name: n.gpus for n in topology.nodes}
        p = self.program = _Program()
        options = [e.name for e in model.spec.deployable_options()]  # solo profiles get no replicas
        self.y = {
            (s, h): p.column(integer=True, upper=capacity[h] // model.gpus[s])
            for s in options
            for h in self.nodes
        }
        self.rate = p.column() if target is None else None
        load: dict[tuple[str, str], dict[int, float]] = {key: {col: -1.0} for key, col in self.y.items()}
        traffic: dict[tuple[str, str], dict[int, float]] = {}
        # (type, hop, previous (option, node) or None at the start, node, column)
        self.columns: list[tuple[str, Hop, tuple[str, str] | None, str, int]] = []
        for request_type in model.spec.request_types:
            graph = model.graphs[request_type.name]
            arriving: dict[int, set[str]] = {}
            for hop in graph.hops:
                arriving.setdefault(hop.target, set()).add(hop.option)
            balance: dict[tuple[int, str, str], dict[int, float]] = {}
            demand: dict[int, float] = {}
            for hop in graph.hops:
                seconds = model.seconds(hop.option, hop.role, request_type.name)
                before = (
                    [None]
                    if hop.source == graph.start
                    else [(s, h) for s in sorted(arriving[hop.source]) for h in self.nodes]
                )
                for previous in before:
                    for node in self.nodes:
                        col = p.column()
                        self.columns.append((request_type.name, hop, previous, node, col))
                        load[(hop.option, node)][col] = seconds
                        if previous is None:
                            demand[col] = 1.0
                        else:
                            balance.setdefault((hop.source, *previous), {})[col] = -1.0
                            sent = topology.edge_bytes.get(f"{previous[0]}->{hop.option}", 0.0)
                            if sent and previous[1] != node:
                                traffic.setdefault((previous[1], node), {})[col] = sent
                        if hop.target != graph.end:
                            balance.setdefault((hop.target, hop.option, node), {})[col] = 1.0
            if target is None:
                assert self.rate is not None  # no target: the rate is a column
                demand[self.rate] = -request_type.share
                p.row(0.0, 0.0, demand)
            else:
                p.row(request_type.share * target, request_type.share * target, demand)
            for entries in balance.values():
                p.row(0.0, 0.0, entries)
        for entries in load.values():
            p.row(-_INF, 0.0, entries)
        for node in self.nodes:
            p.row(-_INF, float(capacity[node]), {self.y[(s, node)]: float(model.gpus[s]) for s in options})
        for (a, b), entries in traffic.items():
            p.row(-_INF, topology.bandwidth_between(a, b), entries)
        if budget is not None:
            p.row(-_INF, float(budget), self.gpu_costs())

    def gpu_costs(self) -> dict[int, float]:
        return {col: float(self.model.gpus[s]) for (s, _), col in self.y.items()}

    def solution(self, values: list[float], throughput: float) -> Solution:
        replicas: dict[str, int] = {}
        placement: dict[str, dict[str, int]] = {}
        for (s, node), col in self.y.items():
            count = int(round(values[col]))
            if count:
                replicas[s] = replicas.get(s, 0) + count
                placement.setdefault(node, {})[s] = count
        rates: dict[tuple[str, str], float] = {}
        entering: dict[str, float] = {}
        for request_type in self.model.spec.request_types:
            graph = self.model.graphs[request_type.name]
            edges = []
            for t, hop, previous, node, col in self.columns:
                if t != request_type.name:
                    continue
                flow = max(0.0, values[col])
                source = "start" if previous is None else (hop.source, *previous)
                target = "end" if hop.target == graph.end else (hop.target, hop.option, node)
                edges.append((source, target, hop.option, flow))
                if previous is None:
                    entering[node] = entering.get(node, 0.0) + flow
            for name, rate in split_paths(edges, "start", "end", request_type.share * throughput).items():
                rates[(request_type.name, name)] = rate
        gpus = sum(self.model.gpus[s] * n for s, n in replicas.items())
        return Solution(throughput, replicas, rates, gpus, placement, entering)


def max_throughput_on_topology(model: Model, budget: int | None = None) -> Solution:
    """Highest throughput on the spec's nodes and links (optionally within `budget` GPUs), fewest GPUs."""
    placed = _Placed(model, budget, None)
    program, rate = placed.program, placed.rate
    assert rate is not None  # no target: the rate is a column
    program.cost[rate] = 1.0
    program.build(maximize=True)
    values = program.solve()
    if values is None:
        raise InfeasibleError("the topology-aware problem has no solution")
    best = values[rate]
    if best <= 1e-9:
        raise InfeasibleError(
            "no placement on the topology's nodes serves every request type: a node needs enough GPUs "
            "for each option of some path, or the links need bandwidth for the edges between nodes"
        )
    return placed.solution(_fewest_gpus_at(program, rate, values, best, placed.gpu_costs()), best)


def min_gpus_on_topology(model: Model, target: float) -> Solution:
    """Fewest GPUs on the spec's nodes and links sustaining `target` req/s (Appendix A as written)."""
    check_target(target)
    return fewest_gpus(
        _Placed(model, None, target),
        target,
        f"the topology's nodes and links cannot sustain {target:g} req/s; lower the target or add nodes or bandwidth",
    )
