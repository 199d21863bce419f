"""From measurements to the planner's spec, and from a spec's options back to the app's deployments.

Names are the app's own: components are deployment paths (`omni.thinker`, as `prismserve check`
prints them), request types are `ChatRequest.request_type`. A deployment's solo option is named
after it and runs it on whole GPUs (`gpus`); an option whose name joins several deployments with
`+` runs them together on its GPUs, each at the app's share of a GPU.
"""

from __future__ import annotations

import math
from typing import Any

from prismserve.app import App
from prismserve.errors import InvalidRequestError
from prismserve.planner import DeploymentOption, PlanSpec, RequestType
from prismserve.planner.paths import entry_roles


def build_spec(
    app: App,
    shares: dict[str, float],
    uses: dict[str, list[str]],
    seconds: dict[str, dict[str, float]],
) -> PlanSpec:
    """The spec of an app's solo deployments: `uses[type]` its deployments in call order,
    `seconds[type][deployment]` replica seconds per request measured at batch."""
    from prismserve.profile.requests import model_order

    components = model_order(list(uses.values()))
    named = app.named_unit_tasks()
    options = []
    for d in components:
        missing = sorted(t for t in uses if d in uses[t] and not seconds.get(t, {}).get(d))
        if missing:
            raise InvalidRequestError(
                f"deployment {d!r} was called by {missing} requests but no time was measured for it there"
            )
        roles = {t: {d: seconds[t][d]} for t in uses if d in uses[t]}
        mean = sum(shares[t] * roles[t][d] for t in roles)
        options.append(
            DeploymentOption(
                name=d,
                components=[d],
                gpus=max(1, math.ceil(named[d].gpus)),
                throughput=1.0 / mean,
                role_seconds=roles,
            )
        )
    options += _colocated(app, components, shares, uses, seconds)
    return PlanSpec(
        components=components,
        options=options,
        request_types=[
            RequestType(name=t, components=[d for d in components if d in uses[t]], share=shares[t])
            for t in sorted(uses)
        ],
    )


def option_layout(spec: PlanSpec, app: App) -> dict[str, dict[str, float]]:
    """Each option of `spec` as the runtime deploys it: deployment path -> GPUs of its replica."""
    named = app.named_unit_tasks()
    layout: dict[str, dict[str, float]] = {}
    for option in spec.options:
        unknown = sorted(set(option.components) - set(named))
        if unknown:
            raise InvalidRequestError(
                f"option {option.name!r} runs {unknown}, which app {app.name!r} does not have "
                f"(its deployments: {sorted(named)}); profile the app again"
            )
        if len(option.components) == 1:
            layout[option.name] = {option.components[0]: float(option.gpus)}
            continue
        shares = {c: named[c].gpus for c in option.components}
        if sum(shares.values()) > option.gpus + 1e-9:
            raise InvalidRequestError(
                f"option {option.name!r} runs {option.components} together on {option.gpus} GPUs, "
                f"but their GPUs in the app sum to {sum(shares.values()):g}"
            )
        layout[option.name] = shares
    return layout


def spec_document(spec: PlanSpec, about: dict[str, Any]) -> str:
    """The spec as YAML, with a comment saying where its numbers come from."""
    import yaml

    header = "".join(f"# {key}: {value}\n" for key, value in about.items())
    return header + yaml.safe_dump(spec.model_dump(exclude_none=True, exclude_defaults=True), sort_keys=False)


def _colocated(
    app: App,
    components: list[str],
    shares: dict[str, float],
    uses: dict[str, list[str]],
    seconds: dict[str, dict[str, float]],
) -> list[DeploymentOption]:
    """The colocations the app expresses: deployments it gives shares of a GPU, packed as registration
    packs them (first-fit-decreasing into one GPU). They were measured packed so: a group's time for a
    role is the sum of its members' times, since they share the GPU's compute."""
    from prismserve.runtime.resources import first_fit_decreasing

    named = app.named_unit_tasks()
    shared = [(d, named[d].gpus) for d in components if 0 < named[d].gpus < 1]
    options = []
    for group in first_fit_decreasing(shared):
        members = [d for d in components if d in group]
        if len(members) < 2:
            continue
        roles: dict[str, dict[str, float]] = {}
        for t, used in uses.items():
            for role in entry_roles([d for d in components if d in used], members):
                roles.setdefault(t, {})["+".join(role)] = sum(seconds[t][d] for d in role)
        if not roles:
            continue
        whole = {t: sum(seconds[t].get(d, 0.0) for d in members) for t in roles}
        options.append(
            DeploymentOption(
                name="+".join(members),
                components=members,
                gpus=1,
                throughput=1.0 / sum(shares[t] * whole[t] for t in roles),
                role_seconds=roles,
            )
        )
    return options
