"""The deployed plan's path probabilities for the request being served: context, not task state.

A plan is deployed for an app, and its routing (`routing[request_type][path]`, 000 §5.3) reaches
the app's routers through this context variable, set by the runtime around each request. Task
objects (often module-level in an app file, shared by apps) are never changed by a deployment.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

Routing = Mapping[str, Mapping[str, float]]

current_routing: ContextVar[Routing | None] = ContextVar("prismserve_routing", default=None)


@contextmanager
def use_routing(routing: Routing | None) -> Iterator[None]:
    """Route the requests served inside the block by `routing` (None: each router's own default)."""
    token = current_routing.set(routing)
    try:
        yield
    finally:
        current_routing.reset(token)
