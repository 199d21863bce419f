"""Routing: how a request's path is chosen (the plan's probabilities, realised by smooth weighted
round-robin), and how a deployment's replica is picked.

A plan is deployed for an app, and its routing (`routing[request_type][path]`, 000 §5.3) reaches
the app's routers through the request's context (`RequestContext.routing`), set by the runtime
around each request. Task objects (often module-level in an app file, shared by apps) are never
changed by a deployment.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import Literal

from prismserve.task.context import Routing
from prismserve.task.errors import TaskUsageError
from prismserve.task.session import current_session, replayable_choice

__all__ = ["ROUTING_POLICIES", "Routing", "RoutingPolicy", "planned_choice", "round_robin"]

# How a deployment's replica is picked for an invocation: `static` (the fewest leases, round-robin
# among ties; no replica asked anything), `dynamic` (least loaded: each replica asked its queue
# depth) or `tokens` (the fewest pending tokens, ModServe's token-aware routing: counted by the task
# manager as leases come and go, from each invocation's `UnitTask.pending_tokens`).
RoutingPolicy = Literal["static", "dynamic", "tokens"]
ROUTING_POLICIES: tuple[RoutingPolicy, ...] = ("static", "dynamic", "tokens")

# Smooth weighted round-robin state per (key, weights): a deployment's new routing starts afresh.
_CREDITS: dict[tuple[Hashable, tuple[float, ...]], list[float]] = {}
_CREDITS_LOCK = threading.Lock()
_CREDITS_KEPT = 4096  # distinct (key, weights) remembered before the table is cleared


def planned_choice(key: Hashable, weights: Sequence[float]) -> int:
    """The path (index into `weights`) for the next request of `key` (e.g. its type), recorded as
    `replayable_choice` records its samples, so that replay follows it.

    The plan's probabilities are realised by smooth weighted round-robin (nginx's): every path
    gains its weight, the one with the most credit is taken and pays the total. Over any n
    requests of a key each path gets within about one request of n·p, and its requests are evenly
    spread; independent draws stray by √(n·p·(1−p)) — ±9 of 400 at p = 0.3 — and a plan whose every
    deployment option is saturated loses the excess of whichever option drew too many (docs/planner.md).
    """
    session = current_session.get()
    if session is None:
        raise TaskUsageError("planned_choice() must be called inside a task's invoke()")
    if not session.recording:
        return replayable_choice(len(weights))  # replay returns the recorded index
    chosen = round_robin(key, weights)
    return replayable_choice(len(weights), [1.0 if i == chosen else 0.0 for i in range(len(weights))])


def round_robin(key: Hashable, weights: Sequence[float]) -> int:
    """The next index for `key` by smooth weighted round-robin over `weights` (≥ 0, positive sum);
    its state is per (key, weights), shared by the process."""
    total = sum(weights)
    if not (total > 0 and all(w >= 0 for w in weights)):
        raise ValueError(f"weighted round-robin needs weights >= 0 with a positive sum, got {list(weights)}")
    with _CREDITS_LOCK:
        state = (key, tuple(weights))
        credits = _CREDITS.get(state)
        if credits is None:
            if len(_CREDITS) >= _CREDITS_KEPT:
                _CREDITS.clear()
            credits = _CREDITS[state] = [0.0] * len(weights)
        for i, weight in enumerate(weights):
            credits[i] += weight
        chosen = max((i for i, weight in enumerate(weights) if weight > 0), key=credits.__getitem__)
        credits[chosen] -= total
    return chosen
