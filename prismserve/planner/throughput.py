"""Algorithm 3 (000 Appendix C): per-type, per-path throughput `w[s,t,p]` from option profiles.

Processing times add where rates do not: each singleton option's profiled throughput at the
mix gives its component's time per request `τ_c`; a colocated option gets one colocation factor
`α_s` that matches its measured mean; a role's time on a path is `α_s · Σ τ_c` over the role.
"""

from __future__ import annotations

from functools import cached_property

from prismserve.planner.paths import Path, RouteGraph, route_graph
from prismserve.planner.spec import PlanSpec


class Model:
    """A spec prepared for solving: each type's route graph and the time each hop costs its option."""

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self.tau: dict[str, float] = {}  # τ_c: seconds per request of component c alone
        self.alpha: dict[str, float] = {}  # α_s: colocation factor of option s
        self._own: dict[str, float] = {}  # singleton options: seconds per request of their component
        self._role_seconds: dict[tuple[str, str | None, frozenset[str]], float] = {
            (e.name, t, frozenset(role.split("+"))): seconds
            for e in spec.options
            for t, roles in e.role_seconds.items()
            for role, seconds in roles.items()
        }
        self.gpus: dict[str, int] = {e.name: e.gpus for e in spec.options}
        self.graphs: dict[str, RouteGraph] = {}

    def seconds(self, option: str, role: frozenset[str], request_type: str | None = None) -> float:
        """Replica time option `s` spends per request (of `request_type`) whose role there is `role`."""
        measured = self._role_seconds.get((option, request_type, role))
        if measured is not None:
            return measured  # profiled for exactly this role: no estimate needed
        own = self._own.get(option)
        if own is not None:
            return own  # a singleton option serves its one component at its own profiled speed
        return self.alpha[option] * sum(self.tau[c] for c in role)

    @cached_property
    def paths(self) -> dict[str, list[Path]]:
        """Every valid path of every type (enumerated on first use; the MILP works on hops)."""
        return {
            t: [Path(tuple(h.option for h in walk), tuple(h.role for h in walk)) for walk in graph.walks()]
            for t, graph in self.graphs.items()
        }

    @cached_property
    def work(self) -> dict[tuple[str, str, int], float]:
        """Seconds of option s's replica time per request of type t on path p (index into `paths`)."""
        work: dict[tuple[str, str, int], float] = {}
        for t, paths in self.paths.items():
            for index, path in enumerate(paths):
                for name, role in zip(path.options, path.roles, strict=True):
                    key = (name, t, index)
                    work[key] = work.get(key, 0.0) + self.seconds(name, role, t)
        return work

    def throughput(self, option: str, request_type: str, path: int) -> float:
        """`w[s,t,p]` in requests/s (infinite when s is not on the path)."""
        seconds = self.work.get((option, request_type, path), 0.0)
        return float("inf") if seconds == 0 else 1.0 / seconds


def build_model(spec: PlanSpec) -> Model:
    """Algorithm 3's times and factors, and the route graph of every request type."""
    model = Model(spec)
    shares = {t.name: t.share for t in spec.request_types}
    fraction = {c: sum(t.share for t in spec.request_types if c in t.components) for c in spec.components}
    for option in spec.options:
        if len(option.components) == 1:
            (c,) = option.components
            y = 1.0 / option.throughput
            # The profile counts every request of the mix; only `fraction` of them use c.
            model._own[option.name] = y / fraction[c] if fraction[c] > 0 else y
            model.alpha[option.name] = 1.0
    for c in spec.components:
        # τ_c from the option that runs c alone (the one with the fewest GPUs when there are several).
        alone = [e for e in spec.options if e.components == [c]]
        if alone:
            model.tau[c] = model._own[min(alone, key=lambda e: e.gpus).name]
    for option in spec.options:
        if len(option.components) == 1:
            continue
        demand = sum(
            shares[t.name] * sum(model.tau[c] for c in set(option.components) & set(t.components))
            for t in spec.request_types
        )
        model.alpha[option.name] = (1.0 / option.throughput) / demand if demand > 0 else 1.0
    for request_type in spec.request_types:
        model.graphs[request_type.name] = route_graph(spec, request_type)
    return model
