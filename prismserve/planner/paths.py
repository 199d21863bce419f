"""Valid paths of a request type through the option graph (000 Appendix B, papers/NOTES.md).

Each option on a path runs every component it holds that is still to run (its role,
`Comp(s) ∩ R`); roles must be non-empty and follow model order, and every component of the
request type runs exactly once. So `{L}` can run on a colocated `EL` (role `{L}`), while `EG`
cannot start `{E, L, G}` (its role `{E, G}` would run G before L). A `separable` option instead
runs the next block of the type's components it holds, and may come back for a later block
(TriInfer's ED: `ED→P→ED`, encode, prefill elsewhere, then decode).

A consequence the solver uses: on a valid path every role is a contiguous block of the type's
components in model order (a skipped component could never run later), so the components done
so far are always a prefix. A type's paths are therefore the start-to-end walks of a small DAG
over prefix lengths whose edges are hops `(i → j, option)`; the MILP puts a flow on each hop
instead of a rate on each of the exponentially many paths, with the same optimum.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from prismserve.planner.errors import SpecError
from prismserve.planner.spec import PlanSpec, RequestType


@dataclass(frozen=True)
class Path:
    """A path: options in order, and the components each runs on it."""

    options: tuple[str, ...]
    roles: tuple[frozenset[str], ...]

    @property
    def name(self) -> str:
        """Option names joined by `->`."""
        return path_name(self.options)


def path_name(options: tuple[str, ...] | list[str]) -> str:
    """The name of a path: its options joined by `->`."""
    return "->".join(options)


@dataclass(frozen=True)
class Hop:
    """One option's step on a request type's route graph: from state `source` to `target`."""

    source: int
    target: int
    option: str
    role: frozenset[str]


@dataclass
class RouteGraph:
    """A request type's valid paths as a DAG of hops; every start-to-end walk is a valid path.

    Enumerated types use states 0..k (components done so far, a prefix). Types with explicit
    paths get one chain of states per path, so exactly the listed paths are walks.
    """

    request_type: str
    start: int
    end: int
    hops: list[Hop] = field(default_factory=list)

    def out_hops(self) -> dict[int, list[Hop]]:
        """Hops leaving each state."""
        out: dict[int, list[Hop]] = {}
        for hop in self.hops:
            out.setdefault(hop.source, []).append(hop)
        return out

    def walks(self) -> Iterator[tuple[Hop, ...]]:
        """Every start-to-end walk, depth first."""
        out = self.out_hops()
        stack: list[tuple[int, tuple[Hop, ...]]] = [(self.start, ())]
        while stack:
            state, prefix = stack.pop()
            if state == self.end:
                yield prefix
                continue
            for hop in reversed(out.get(state, [])):
                stack.append((hop.target, (*prefix, hop)))


def roles_of(
    spec: PlanSpec, request_type: RequestType, options: list[str]
) -> tuple[frozenset[str], ...] | None:
    """The role of each option on the path, or None when the path is not valid for the type."""
    needs = sorted(request_type.components, key=spec.components.index)
    held = {e.name: e for e in spec.options}
    roles: list[frozenset[str]] = []
    done = 0
    for name in options:
        option = held[name]
        role = entry_role(needs, done, option.components, option.separable)
        if not role:
            return None
        roles.append(frozenset(role))
        done += len(role)
    return tuple(roles) if done == len(needs) else None


def entry_role(
    needs: Sequence[str], start: int, members: Iterable[str], separable: bool = False
) -> tuple[str, ...]:
    """The role an option holding `members` takes on a request needing `needs` (in model order) when
    it is entered at `needs[start]`: the members still to run, if they are the next block of `needs`
    (a component it skipped could never run); else () — it cannot be entered there. A `separable`
    option takes the next block of `needs` it holds, leaving the rest for a later visit."""
    held = set(members)
    if separable:
        block = itertools.takewhile(lambda c: c in held, needs[start:])
        return tuple(block)
    role = tuple(c for c in needs[start:] if c in held)
    return role if role and role == tuple(needs[start : start + len(role)]) else ()


def entry_roles(
    needs: Sequence[str], members: Iterable[str], separable: bool = False
) -> list[tuple[str, ...]]:
    """Every role an option holding `members` can take on a request needing `needs` (one per entry
    point it can be entered at)."""
    return [role for i in range(len(needs)) if (role := entry_role(needs, i, members, separable))]


def route_graph(spec: PlanSpec, request_type: RequestType) -> RouteGraph:
    """The type's route graph: its explicit paths (checked), or every valid option sequence."""
    if request_type.paths is not None:
        graph = RouteGraph(request_type.name, start=0, end=1)
        next_state = 2
        for options in request_type.paths:
            roles = roles_of(spec, request_type, options)
            if roles is None:
                raise SpecError(
                    f"request type {request_type.name!r}: path {path_name(options)} does not run each of "
                    f"{request_type.components} exactly once in model order; fix or remove it"
                )
            states = [0] + list(range(next_state, next_state + len(options) - 1)) + [1]
            next_state += len(options) - 1
            for i, (name, role) in enumerate(zip(options, roles, strict=True)):
                graph.hops.append(Hop(states[i], states[i + 1], name, role))
        return graph
    ordered = sorted(request_type.components, key=spec.components.index)
    k = len(ordered)
    graph = RouteGraph(request_type.name, start=0, end=k)
    candidates = [
        Hop(i, i + len(block), option.name, frozenset(block))
        for i in range(k)
        for option in spec.deployable_options()
        if (block := entry_role(ordered, i, option.components, option.separable))
    ]
    # Keep hops on some start-to-end walk, so that the solver sees no dead ends.
    forward = {0}
    for hop in sorted(candidates, key=lambda h: h.source):
        if hop.source in forward:
            forward.add(hop.target)
    backward = {k}
    for hop in sorted(candidates, key=lambda h: -h.target):
        if hop.target in backward:
            backward.add(hop.source)
    graph.hops = [h for h in candidates if h.source in forward and h.target in backward]
    if k not in forward:
        raise SpecError(
            f"request type {request_type.name!r} has no valid path: no sequence of options runs "
            f"{ordered} in model order; add an option that covers them"
        )
    return graph


def valid_paths(spec: PlanSpec, request_type: RequestType) -> list[Path]:
    """The type's paths: as given in the spec (checked), or every valid option sequence."""
    graph = route_graph(spec, request_type)
    return [Path(tuple(h.option for h in walk), tuple(h.role for h in walk)) for walk in graph.walks()]
