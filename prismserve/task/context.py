"""RequestContext: the request being served, as one typed value in one context variable.

Set where a request enters — the runtime around each request it serves (`Runtime.request`), a
replica around each call it runs — and read where needed: the app's routers (`routing`), record &
replay (`task_names`), the dispatcher (`targets`, `ledger`, `first_due`), the task managers
(`era`), the executors' queues (`deadline`). Task objects are never changed by a request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

# A deployed plan's path probabilities by request type (000 §5.3): `routing[request_type][path]`.
Routing = Mapping[str, Mapping[str, float]]
# With `serve --routing path`: a deployment's key -> (its calls in flight, its running replicas),
# read where a request's whole path is chosen (`task.routing.planned_choice`'s `hops`).
PathLoad = Callable[[str], tuple[int, int]]


@dataclass(slots=True)
class RequestLedger:
    """What a request runs up while it is served: the one part of its context that changes, since
    it is known only as its task graphs are recorded and run."""

    tokens: int = 0  # its prompt's tokens as its calls count them (the largest call's)
    # What to release when the request ends: what its graphs left on their replicas.
    at_end: list[Callable[[], None]] = field(default_factory=list)

    def end(self) -> None:
        """Run (once) what was kept for the request's end."""
        callbacks, self.at_end = self.at_end, []
        for callback in callbacks:
            callback()


@dataclass(frozen=True, slots=True)
class RequestContext:
    """The request being served. Fields not known where it is set stay at their defaults."""

    id: str = ""
    app: str | None = None
    request_type: str | None = None  # its label: `image+text->audio` (ChatRequest.request_type)
    start: float = 0.0  # Unix time it arrived
    # Seconds after `start` its first output is due for a prompt of n tokens (its SLO); None: no SLO.
    due_s: Callable[[int], float | None] | None = None
    # In a replica: the Unix time the request of the call being run owes its first output by.
    deadline: float | None = None
    era: int | None = None  # plan switches before it began: it may finish on replicas drained since
    routing: Routing | None = None  # the deployed plan's path probabilities, for the app's routers
    targets: Mapping[str, str] | None = None  # deployment key the app names -> key of its path's replicas
    load: PathLoad | None = None  # path-level routing's view of the deployments' load; None: the plan's split
    task_names: Mapping[int, str] | None = None  # the app's names of its tasks, by id: for errors
    ledger: RequestLedger | None = None  # None: nothing is tracked (outside a runtime's request)

    def first_due(self) -> float | None:
        """The Unix time its first output is due by, for the tokens counted so far (None: no SLO)."""
        if self.due_s is None:
            return None
        due = self.due_s(self.ledger.tokens if self.ledger is not None else 0)
        return None if due is None else self.start + due


_NO_REQUEST = RequestContext()
_current: ContextVar[RequestContext] = ContextVar("prismserve_request", default=_NO_REQUEST)


def current_request() -> RequestContext:
    """The request being served (all defaults outside one)."""
    return _current.get()


@contextmanager
def use_request(context: RequestContext) -> Iterator[RequestContext]:
    """Serve the request inside the block as `context`; the one place the context is set."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
