"""Algorithm 3 (000 Appendix C): per-type, per-path throughput `w[s,t,p]` from executor profiles.

Processing times add where rates do not: each singleton executor's profiled throughput at the
mix gives its component's time per request `τ_c`; a colocated executor gets one colocation factor
`α_s` that matches its measured mean; a role's time on a path is `α_s · Σ τ_c` over the role.
"""

from __future__ import annotations

from functools import cached_property

from prismserve.planner.paths import Path, RouteGraph, route_graph
from prismserve.planner.spec import PlanSpec


class Model:
    """A spec prepared for solving: each type's route graph and the time each hop costs its executor."""

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self.tau: dict[str, float] = {}  # τ_c: seconds per request of component c alone
        self.alpha: dict[str, float] = {}  # α_s: colocation factor of executor s
        self._own: dict[str, float] = {}  # singleton executors: seconds per request of their component
        self._role_seconds: dict[tuple[str, str | None, frozenset[str]], float] = {
            (e.name, t, frozenset(role.split("+"))): seconds
            for e in spec.executors
            for t, roles in e.role_seconds.items()
            for role, seconds in roles.items()
        }
        self.gpus: dict[str, int] = {e.name: e.gpus for e in spec.executors}
        self.graphs: dict[str, RouteGraph] = {}

    def seconds(self, executor: str, role: frozenset[str], request_type: str | None = None) -> float:
        """Replica time executor `s` spends per request (of `request_type`) whose role there is `role`."""
        measured = self._role_seconds.get((executor, request_type, role))
        if measured is not None:
            return measured  # profiled for exactly this role: no estimate needed
        own = self._own.get(executor)
        if own is not None:
            return own  # a singleton executor serves its one component at its own profiled speed
        return self.alpha[executor] * sum(self.tau[c] for c in role)

    @cached_property
    def paths(self) -> dict[str, list[Path]]:
        """Every valid path of every type (enumerated on first use; the MILP works on hops)."""
        return {
            t: [Path(tuple(h.executor for h in walk), tuple(h.role for h in walk)) for walk in graph.walks()]
            for t, graph in self.graphs.items()
        }

    @cached_property
    def work(self) -> dict[tuple[str, str, int], float]:
        """Seconds of executor s's replica time per request of type t on path p (index into `paths`)."""
        work: dict[tuple[str, str, int], float] = {}
        for t, paths in self.paths.items():
            for index, path in enumerate(paths):
                for name, role in zip(path.executors, path.roles, strict=True):
                    key = (name, t, index)
                    work[key] = work.get(key, 0.0) + self.seconds(name, role, t)
        return work

    def throughput(self, executor: str, request_type: str, path: int) -> float:
        """`w[s,t,p]` in requests/s (infinite when s is not on the path)."""
        seconds = self.work.get((executor, request_type, path), 0.0)
        return float("inf") if seconds == 0 else 1.0 / seconds


def build_model(spec: PlanSpec) -> Model:
    """Algorithm 3's times and factors, and the route graph of every request type."""
    model = Model(spec)
    shares = {t.name: t.share for t in spec.request_types}
    fraction = {c: sum(t.share for t in spec.request_types if c in t.components) for c in spec.components}
    for executor in spec.executors:
        if len(executor.components) == 1:
            (c,) = executor.components
            y = 1.0 / executor.throughput
            # The profile counts every request of the mix; only `fraction` of them use c.
            model._own[executor.name] = y / fraction[c] if fraction[c] > 0 else y
            model.alpha[executor.name] = 1.0
    for c in spec.components:
        # τ_c from the executor that runs c alone (the one with the fewest GPUs when there are several).
        alone = [e for e in spec.executors if e.components == [c]]
        if alone:
            model.tau[c] = model._own[min(alone, key=lambda e: e.gpus).name]
    for executor in spec.executors:
        if len(executor.components) == 1:
            continue
        demand = sum(
            shares[t.name] * sum(model.tau[c] for c in set(executor.components) & set(t.components))
            for t in spec.request_types
        )
        model.alpha[executor.name] = (1.0 / executor.throughput) / demand if demand > 0 else 1.0
    for request_type in spec.request_types:
        model.graphs[request_type.name] = route_graph(spec, request_type)
    return model
