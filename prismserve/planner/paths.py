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
    walk = _walk(_Index(spec), request_type, executors)
    return walk[0] if walk is not None and not walk[1] else None


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
        _extend(_Index(spec), frozenset(request_type.components), (), (), -1, found)
    if not found:
        raise SpecError(
            f"request type {request_type.name!r} has no valid path: no sequence of executors runs "
            f"{request_type.components} in model order; add an executor that covers them"
        )
    return found


class _Index:
    """Executors' component sets and the model order, for fast path walks."""

    def __init__(self, spec: PlanSpec) -> None:
        self.order = {c: i for i, c in enumerate(spec.components)}
        self.components = {e.name: frozenset(e.components) for e in spec.executors}


def _walk(index: _Index, request_type: RequestType, executors: list[str]) -> tuple[tuple[frozenset[str], ...], frozenset[str]] | None:
    remaining = frozenset(request_type.components)
    roles = []
    last = -1
    for name in executors:
        role = index.components[name] & remaining
        if not role or min(index.order[c] for c in role) < last:
            return None
        roles.append(role)
        last = max(index.order[c] for c in role)
        remaining -= role
    return tuple(roles), remaining


def _extend(
    index: _Index,
    remaining: frozenset[str],
    prefix: tuple[str, ...],
    roles: tuple[frozenset[str], ...],
    last: int,
    found: list[Path],
) -> None:
    for name, components in index.components.items():
        role = components & remaining
        if not role or min(index.order[c] for c in role) < last:
            continue
        rest = remaining - role
        if rest:
            _extend(index, rest, (*prefix, name), (*roles, role), max(index.order[c] for c in role), found)
        else:
            found.append(Path((*prefix, name), (*roles, role)))
