"""What a running plan sustains at another request mix (000 §5.3, re-planning while serving).

Re-planning asks two questions of the deployment already up: how many requests/s its replicas
sustain at the mix now observed, and what the model looks like at that mix. The first is the
planner's max-throughput program (milp.py) over the same route graphs with every option's
replicas fixed to the plan's — pooled over the plan's cells, since the runtime's task manager picks
among all replicas of a deployment — and the routing left free: a linear program. The second is
the spec with new shares and each option's profiled throughput rescaled so that no per-request
time changes: a replica is as fast as before; it only sees another mix.
"""

from __future__ import annotations

from collections.abc import Mapping

from prismserve.planner.errors import SpecError
from prismserve.planner.milp import Solution, _Routes
from prismserve.planner.plan import Plan
from prismserve.planner.spec import PlanSpec
from prismserve.planner.throughput import Model, build_model


def spec_at_mix(spec: PlanSpec, shares: Mapping[str, float]) -> PlanSpec:
    """`spec` with request-type shares `shares` (weights, normalised; every type of the spec > 0).

    Options' throughputs are profiled *at the mix* (Algorithm 3's input), so each is rescaled to
    keep Algorithm 3's per-request times (`τ_c`, `α_s`) unchanged; measured `role_seconds` are per
    type and stay as they are.
    """
    names = [t.name for t in spec.request_types]
    unknown = sorted(set(shares) - set(names))
    if unknown:
        raise SpecError(f"shares name request types {unknown} the spec does not have; it has {names}")
    missing = [n for n in names if not shares.get(n, 0.0) > 0]
    if missing:
        raise SpecError(
            f"every request type needs a share > 0 (the planner routes each); {missing} have none"
        )
    total = sum(shares[n] for n in names)
    new = {n: shares[n] / total for n in names}
    model = build_model(spec)
    options = [
        e.model_copy(update={"throughput": _throughput_at(model, e.name, e.components, new)})
        for e in spec.options
    ]
    types = [t.model_copy(update={"share": new[t.name]}) for t in spec.request_types]
    return PlanSpec.model_validate(
        {
            **spec.model_dump(),
            "options": [e.model_dump() for e in options],
            "request_types": [t.model_dump() for t in types],
        }
    )


def _throughput_at(model: Model, name: str, components: list[str], shares: dict[str, float]) -> float:
    """The throughput option `name` shows at `shares`, its per-request times held (inverting build_model)."""
    spec = model.spec
    if len(components) == 1:
        (c,) = components
        fraction = sum(shares[t.name] for t in spec.request_types if c in t.components)
        own = model._own[name]  # seconds per request using c
        return 1.0 / (own * fraction) if fraction > 0 else 1.0 / own
    demand = sum(
        shares[t.name] * sum(model.tau[c] for c in set(components) & set(t.components))
        for t in spec.request_types
    )
    if demand <= 0:  # it serves nothing of this mix: its profile says nothing new
        return next(e.throughput for e in spec.options if e.name == name)
    return 1.0 / (model.alpha[name] * demand)


def fixed_replicas_throughput(model: Model, replicas: Mapping[str, int]) -> Solution:
    """The most requests/s `replicas` (per option) sustain at the model's mix, routing re-optimised.

    The max-throughput program of `max_throughput` with `r_s` pinned: an LP. Options the plan
    does not name have no replicas; names the spec does not have are refused.
    """
    unknown = sorted(set(replicas) - set(model.gpus))
    if unknown:
        raise SpecError(
            f"replicas name options {unknown} the spec does not have; it has {sorted(model.gpus)}"
        )
    routes = _Routes(model, None, None)
    program, rate = routes.program, routes.rate
    assert rate is not None  # no target: the rate is a column
    for s, col in routes.r.items():
        n = float(replicas.get(s, 0))
        program.lower[col] = program.upper[col] = n
        program.integer[col] = False
    program.cost[rate] = 1.0
    program.build(maximize=True)
    values = program.solve()
    if values is None or values[rate] <= 1e-9:
        return Solution(0.0, {s: n for s, n in replicas.items() if n}, {}, _gpus(model, replicas))
    solution = routes.solution(values, values[rate])
    solution.replicas = {s: n for s, n in replicas.items() if n}
    solution.gpus = _gpus(model, replicas)
    return solution


def plan_capacity(spec: PlanSpec, plan: Plan) -> float:
    """Requests/s a deployed `plan`'s replicas (named after `spec`'s options) sustain at `spec`'s mix
    (no more than the CPUs they share sustain, when they share a machine's: `spec.host`)."""
    throughput = fixed_replicas_throughput(build_model(spec), plan.replicas()).throughput
    cap = spec.host_capacity()
    return throughput if cap is None else min(throughput, cap)


def _gpus(model: Model, replicas: Mapping[str, int]) -> int:
    return sum(model.gpus[s] * n for s, n in replicas.items())
