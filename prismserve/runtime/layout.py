"""Option layouts: a plan's deployment options realised on an app's deployments, and routing over them.

A plan with `options` names deployment options (`omni.thinker`, `omni.encoders.image+omni.thinker`)
instead of deployments: each option runs one replica of every deployment it lists, with the GPUs
given there, packed together in its cell (a colocated option shares its GPU the way shares of a GPU
always do, docs/runtime.md "GPU shapes"). A deployment at another GPU shape than the app's is
another deployment (the shape is part of its identity), so every option gets replicas of its own.

Request-static routing then needs no `Router` in the app (000 §5.3): per request, a path of its
type is picked by the plan's probabilities (smooth weighted round-robin), and each unit-task call goes to the replicas of the
option on that path that runs its deployment (the request context's `targets`, read by the dispatcher).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prismserve.errors import InvalidRequestError
from prismserve.planner import CellPlan, Plan
from prismserve.task import UnitTask
from prismserve.task.base import _check_gpus
from prismserve.task.errors import TaskDefinitionError
from prismserve.task.routing import PathLoad, least_loaded_path, round_robin


def variant(task: UnitTask[Any, Any], gpus: float) -> UnitTask[Any, Any]:
    """`task` deployed at another GPU shape: an equivalent task with its own deployment key."""
    if gpus == task.gpus:
        return task
    try:
        _check_gpus(type(task), gpus)
    except TaskDefinitionError as exc:
        raise InvalidRequestError(f"plan options: {exc}") from None
    copy = task.model_copy(update={"gpus": gpus})
    copy._key = None  # the copy's key is its own (model_copy keeps the cached one)
    return copy


@dataclass(frozen=True)
class Layout:
    """A plan's deployment options on an app: the tasks they deploy, cells by deployment key, routes."""

    tasks: dict[str, UnitTask[Any, Any]]  # deployment key -> task (variants included)
    cells: list[CellPlan]  # replicas by deployment key
    routes: dict[str, list[tuple[float, dict[str, str]]]]  # type -> [(probability, app key -> key)]
    fallback: dict[str, str]  # app key -> key, for a request type the plan does not route
    # type -> per route, the deployment keys its own options run (path-level routing weighs them)
    hops: dict[str, list[list[str]]] = field(default_factory=dict)

    def targets(self, request_type: str | None, load: PathLoad | None = None) -> dict[str, str]:
        """Where the calls of one request of `request_type` go: the next path of the plan's routing,
        or with `load` (path-level routing) the least loaded of the plan's paths (`least_loaded_path`)."""
        choices = self.routes.get(request_type or "")
        if not choices:
            return self.fallback
        key, weights = (id(self), request_type), [p for p, _ in choices]
        if load is not None and request_type in self.hops:
            hops = [[(d, 1.0) for d in path] for path in self.hops[request_type]]  # work unknown: calls
            return choices[least_loaded_path(key, weights, hops, load)][1]
        # Smooth weighted round-robin, not independent draws: each path gets its share within about
        # one request, which a plan whose options are all saturated needs (docs/planner.md).
        return choices[round_robin(key, weights)][1]


def layout(named: Mapping[str, UnitTask[Any, Any]], plan: Plan) -> Layout:
    """Realise `plan`'s deployment options on an app whose deployments are `named` (path -> task)."""
    unknown = sorted({d for option in plan.options.values() for d in option} - set(named))
    if unknown:
        raise InvalidRequestError(
            f"plan options name deployments {unknown} the app does not have; it has {sorted(named)}"
        )
    keys = {
        option: {d: variant(named[d], gpus) for d, gpus in members.items()}
        for option, members in plan.options.items()
    }
    tasks = {t.deployment_key(): t for members in keys.values() for t in members.values()}
    cells = []
    for cell in plan.cells:
        replicas: dict[str, int] = {}
        for option, n in cell.replicas.items():
            for task in keys[option].values():
                replicas[task.deployment_key()] = replicas.get(task.deployment_key(), 0) + n
        cells.append(cell.model_copy(update={"replicas": replicas}))
    deployed = {option for cell in plan.cells for option, n in cell.replicas.items() if n and cell.count}
    fallback: dict[str, str] = {}
    for option in [o for o in plan.options if o in deployed]:
        for d, task in keys[option].items():
            fallback.setdefault(named[d].deployment_key(), task.deployment_key())
    # A call the path does not cover (a deployment the type was not planned with) takes the fallback.
    routes = {
        request_type: [(p, fallback | _path_targets(named, keys, path)) for path, p in paths.items() if p > 0]
        for request_type, paths in plan.routing.items()
    }
    hops = {
        request_type: [
            sorted(set(_path_targets(named, keys, path).values())) for path, p in paths.items() if p > 0
        ]
        for request_type, paths in plan.routing.items()
    }
    return Layout(tasks, cells, routes, fallback, hops)


def _path_targets(
    named: Mapping[str, UnitTask[Any, Any]], keys: dict[str, dict[str, UnitTask[Any, Any]]], path: str
) -> dict[str, str]:
    """For one path (options joined by `->`): each deployment goes to the first option on it holding it
    (a later option that also holds it runs only what is still to run, its role)."""
    targets: dict[str, str] = {}
    for option in path.split("->"):
        for d, task in keys[option].items():
            targets.setdefault(named[d].deployment_key(), task.deployment_key())
    return targets


def check_layout(plan: Plan) -> None:
    """Raise InvalidRequestError if a plan with deployment options names one it does not define."""
    if not plan.options:
        return
    named = {name for cell in plan.cells for name in cell.replicas}
    named |= {option for paths in plan.routing.values() for path in paths for option in path.split("->")}
    unknown = sorted(named - set(plan.options))
    if unknown:
        raise InvalidRequestError(
            f"plan names options {unknown} that its `options` does not define; it defines "
            f"{sorted(plan.options)}"
        )
