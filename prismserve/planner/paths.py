"""Valid paths of a request type through the executor graph (000 Appendix B, papers/NOTES.md).

Each executor on a path runs every component it holds that is still to run (its role,
`Comp(s) ∩ R`); roles must be non-empty and follow model order, and every component of the
request type runs exactly once. So `{L}` can run on a colocated `EL` (role `{L}`), while `EG`
cannot serve `{E, L, G}` (its role `{E, G}` would run G before L).
"""

from __future__ import annotations

from dataclasses import dataclass

from prismserve.planner.errors import SpecError
from prismserve.planner.spec import PlanSpec, RequestType


@dataclass(frozen=True)
class Path:
    """A path: executors in order, and the components each runs on it."""

    executors: tuple[str, ...]
    roles: tuple[frozenset[str], ...]

    @property
    def name(self) -> str:
        """Executor names joined by `->`."""
        return "->".join(self.executors)


def roles_of(spec: PlanSpec, request_type: RequestType, executors: list[str]) -> tuple[frozenset[str], ...] | None:
    """The role of each executor on the path, or None when the path is not valid for the type."""
    order = {c: i for i, c in enumerate(spec.components)}
    remaining = set(request_type.components)
    roles = []
    last = -1
    for name in executors:
        role = frozenset(set(spec.executor(name).components) & remaining)
        if not role or min(order[c] for c in role) < last:
            return None
        roles.append(role)
        last = max(order[c] for c in role)
        remaining -= role
    return tuple(roles) if not remaining else None


def valid_paths(spec: PlanSpec, request_type: RequestType) -> list[Path]:
    """The type's paths: as given in the spec (checked), or every valid executor sequence."""
    if request_type.paths is not None:
        paths = []
        for executors in request_type.paths:
            for name in executors:
                spec.executor(name)
            roles = roles_of(spec, request_type, executors)
            if roles is None:
                raise SpecError(
                    f"request type {request_type.name!r}: path {'->'.join(executors)} does not run each of "
                    f"{request_type.components} exactly once in model order"
                )
            paths.append(Path(tuple(executors), roles))
        found = paths
    else:
        found = []
        _extend(spec, request_type, [], found)
    if not found:
        raise SpecError(
            f"request type {request_type.name!r} has no valid path: no sequence of executors runs "
            f"{request_type.components} in model order; add an executor that covers them"
        )
    return found


def _extend(spec: PlanSpec, request_type: RequestType, prefix: list[str], found: list[Path]) -> None:
    if len(prefix) == len(request_type.components):
        return
    for executor in spec.executors:
        candidate = [*prefix, executor.name]
        roles = roles_of(spec, request_type, candidate)
        if roles is not None:
            found.append(Path(tuple(candidate), roles))
            continue
        if _valid_prefix(spec, request_type, candidate):
            _extend(spec, request_type, candidate, found)


def _valid_prefix(spec: PlanSpec, request_type: RequestType, executors: list[str]) -> bool:
    order = {c: i for i, c in enumerate(spec.components)}
    remaining = set(request_type.components)
    last = -1
    for name in executors:
        role = set(spec.executor(name).components) & remaining
        if not role or min(order[c] for c in role) < last:
            return False
        last = max(order[c] for c in role)
        remaining -= role
    return bool(remaining)
