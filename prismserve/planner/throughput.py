"""Algorithm 3 (000 Appendix C): per-type, per-path throughput `w[s,t,p]` from executor profiles.

Processing times add where rates do not: each singleton executor's profiled throughput at the
mix gives its component's time per request `τ_c`; a colocated executor gets one colocation factor
`α_s` that matches its measured mean; a role's time on a path is `α_s · Σ τ_c` over the role.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prismserve.planner.paths import Path, valid_paths
from prismserve.planner.spec import PlanSpec


@dataclass
class Model:
    """A spec prepared for solving: paths per type and the work each path puts on each executor."""

    spec: PlanSpec
    paths: dict[str, list[Path]] = field(default_factory=dict)
    # seconds of executor s's replica time per request of type t on path p: 1 / w[s,t,p]
    work: dict[tuple[str, str, int], float] = field(default_factory=dict)
    alpha: dict[str, float] = field(default_factory=dict)
    tau: dict[str, float] = field(default_factory=dict)

    def throughput(self, executor: str, request_type: str, path: int) -> float:
        """`w[s,t,p]` in requests/s (infinite when s is not on the path)."""
        seconds = self.work.get((executor, request_type, path), 0.0)
        return float("inf") if seconds == 0 else 1.0 / seconds


def build_model(spec: PlanSpec) -> Model:
    """Paths of every request type and the per-path work of every executor."""
    model = Model(spec)
    shares = {t.name: t.share for t in spec.request_types}
    fraction = {c: sum(t.share for t in spec.request_types if c in t.components) for c in spec.components}
    # τ_c from the executor that runs c alone (the one with the fewest GPUs when there are several).
    own_time: dict[str, float] = {}
    for executor in spec.executors:
        y = 1.0 / executor.throughput
        if len(executor.components) == 1:
            (c,) = executor.components
            own_time[executor.name] = y / fraction[c] if fraction[c] > 0 else y
            best = min((e for e in spec.executors if e.components == [c]), key=lambda e: e.gpus)
            if best is executor:
                model.tau[c] = own_time[executor.name]
    for executor in spec.executors:
        if len(executor.components) == 1:
            model.alpha[executor.name] = 1.0
            continue
        demand = sum(
            shares[t.name] * sum(model.tau[c] for c in set(executor.components) & set(t.components))
            for t in spec.request_types
        )
        model.alpha[executor.name] = (1.0 / executor.throughput) / demand if demand > 0 else 1.0
    for request_type in spec.request_types:
        paths = valid_paths(spec, request_type)
        model.paths[request_type.name] = paths
        for index, path in enumerate(paths):
            for name, role in zip(path.executors, path.roles):
                if name in own_time:
                    seconds = own_time[name]  # a singleton executor at its own profiled speed
                else:
                    seconds = model.alpha[name] * sum(model.tau[c] for c in role)
                key = (name, request_type.name, index)
                model.work[key] = model.work.get(key, 0.0) + seconds
    return model
