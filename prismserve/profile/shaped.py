"""Profiling an app that gives its spec's shape: options, request types and paths from the app, every
time measured on its replicas.

An emulated model (`prismserve.emulate`) runs deployment options that are alternatives for the same
components (`E`, `EP`, `EPD` …), which recording one request cannot reveal: its `Config.planner_spec`
says which options, types and paths exist. Its numbers are not taken from it. One replica of each
option is deployed as the app deploys it (`Config.deployment_plan`: the sim profiles its replicas
run with), and rounds of each request type are sent along paths that between them take every
(option, role) pair of the type; each hop's replica seconds per request are read from its busy time
(`measure.py`), as for any model. A prediction made from this profile is then checked by serving,
not true by construction.

A path is timed on one round that fills its replicas' batches (`batch`, or their `max_batch` if
larger) with the type's requests, each asking for its mean output tokens (`requests.profile_requests`:
with the workload's own outputs a round would drain), after a single warm-up round for the whole
app: a type has many paths (every role of a monolithic option is a path of its own), and the rounds
of several paths already repeat each option's work, so `rounds` more per path would multiply a
profile's minutes for little.
"""

from __future__ import annotations

import logging
from typing import Any

from prismserve.app import App
from prismserve.bench import workloads as w
from prismserve.bench.workloads import RequestSpec
from prismserve.errors import InvalidRequestError
from prismserve.planner import CellPlan, Plan, PlanSpec
from prismserve.planner.paths import Path, entry_role, valid_paths
from prismserve.profile.measure import seconds_per_request
from prismserve.profile.requests import profile_requests
from prismserve.protocol.chat import ChatRequest

log = logging.getLogger(__name__)

# Role seconds measured: option -> request type -> role ("+"-joined components) -> seconds.
Measured = dict[str, dict[str, dict[str, float]]]


async def profile_shaped(
    runtime: Any, app: App, kept: list[RequestSpec], batch: int, rounds: int
) -> PlanSpec:
    """The spec of `app` for the mix of `kept`: the shape of `app.config.planner_spec(kept)`, its
    options' `role_seconds` and throughputs measured on one replica of each option. `rounds` is
    not used: each path is timed on one round (see above)."""
    assert app.config.planner_spec is not None  # the caller checked
    shape = PlanSpec.model_validate(app.config.planner_spec(kept))
    deployments, largest = await _deploy_one_of_each(runtime, app, shape)
    examples = profile_requests(kept, w.workloads_dir(), max(batch, largest) * 2)
    keys = {option: app.named_unit_tasks()[path].deployment_key() for option, path in deployments.items()}
    measured: Measured = {o.name: {} for o in shape.options}
    warm = False  # one warm-up round for the whole app
    for request_type in shape.request_types:
        for path in covering(valid_paths(shape, request_type)):
            row = await _time_path(runtime, app, request_type.name, path, examples, max(batch, largest), warm)
            warm = True
            order = [c for c in shape.components if c in request_type.components]
            for option, role in zip(path.options, path.roles, strict=True):
                if keys[option] not in row:
                    raise InvalidRequestError(
                        f"path {path.name} of {request_type.name!r} requests never called option "
                        f"{option!r} ({deployments[option]}): the app does not follow the routing it is "
                        "given, so its options cannot be profiled"
                    )
                key = "+".join(c for c in order if c in role)
                measured[option].setdefault(request_type.name, {})[key] = row[keys[option]]
    return _measured_spec(shape, measured)


async def _time_path(
    runtime: Any,
    app: App,
    request_type: str,
    path: Path,
    examples: dict[str, list[ChatRequest]],
    batch: int,
    warm: bool,
) -> dict[str, float]:
    """Deployment key -> replica seconds per request of `request_type` sent along `path`, on one
    round of `batch` requests (after a warm-up round unless the replicas are `warm`)."""
    routing = {request_type: {path.name: 1.0}}
    times, _ = await seconds_per_request(
        runtime, app, {request_type: examples[request_type]}, batch, 1, routing=routing, warm_up=not warm
    )
    return times.get(request_type, {})


async def _deploy_one_of_each(runtime: Any, app: App, shape: PlanSpec) -> tuple[dict[str, str], int]:
    """Deploy one replica of every option of `shape` as the app deploys a plan; returns option ->
    deployment path, and the largest batch a replica forms (a round fills it)."""
    if app.config.deployment_plan is None:
        raise InvalidRequestError(
            f"app {app.name!r} gives `planner_spec` but no `deployment_plan`: its Config needs both, "
            "the second to deploy each option for the profile"
        )
    cells = [CellPlan(gpus=o.gpus, count=1, replicas={o.name: 1}) for o in shape.options]
    planned = Plan(cells=cells, gpus=sum(o.gpus for o in shape.options))
    deployed = Plan.model_validate(app.config.deployment_plan(planned))
    deployments = {}
    for option, cell in zip(shape.options, deployed.cells, strict=True):
        (deployments[option.name],) = cell.replicas  # one deployment per option's cell
    await runtime.deploy(app.name, deployed)
    largest = max((int(p.get("max_batch", 1)) for p in deployed.profiles.values()), default=1)
    return deployments, largest


def covering(paths: list[Path]) -> list[Path]:
    """Paths that between them take every (option, role) pair of `paths`, none visiting an option
    twice (its busy time could not be told apart by role); fewest hops first, so that a role is
    timed where it is least disturbed by others."""
    pairs = {(o, r) for p in paths for o, r in zip(p.options, p.roles, strict=True)}
    chosen: list[Path] = []
    covered: set[tuple[str, frozenset[str]]] = set()
    for path in sorted(paths, key=lambda p: (len(p.options), p.name)):
        hops = set(zip(path.options, path.roles, strict=True))
        if len(set(path.options)) == len(path.options) and not hops <= covered:
            chosen.append(path)
            covered |= hops
    if covered != pairs:
        missing = sorted(f"{o} running {'+'.join(sorted(r))}" for o, r in pairs - covered)
        log.info("roles only reachable by visiting an option twice are left to the planner: %s", missing)
    return chosen


def _measured_spec(shape: PlanSpec, measured: Measured) -> PlanSpec:
    """`shape` with each option's role seconds and throughput (the inverse of its mean measured
    seconds per request of the mix, every component it holds run on it) as measured."""
    options = []
    for option in shape.options:
        roles = measured[option.name]
        mean = sum(t.share * seconds for t in shape.request_types if (seconds := _whole(option, t, roles)))
        if mean <= 0:
            raise InvalidRequestError(
                f"option {option.name!r} was never timed on a request: no request type of the workload "
                "has a path through it; profile with a workload that uses it"
            )
        options.append(option.model_copy(update={"throughput": 1.0 / mean, "role_seconds": roles}))
    return shape.model_copy(update={"options": options})


def _whole(option: Any, request_type: Any, roles: dict[str, dict[str, float]]) -> float:
    """Seconds `option` spends on a request of `request_type` running every component of it that
    it holds: its measured roles laid end to end along the type's components (0: none measured)."""
    needs = [c for c in request_type.components]
    timed = roles.get(request_type.name, {})
    total, start = 0.0, 0
    while start < len(needs):
        role = entry_role(needs, start, option.components, option.separable)
        key = "+".join(role)
        if role and key in timed:
            total += timed[key]
            start += len(role)
        else:
            start += 1
    return total
