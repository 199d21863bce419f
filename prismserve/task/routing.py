"""Routing: how a request's path is chosen (the plan's probabilities, realised by smooth weighted
round-robin), and how a deployment's replica is picked.

A plan is deployed for an app, and its routing (`routing[request_type][path]`, 000 §5.3) reaches
the app's routers through the request's context (`RequestContext.routing`), set by the runtime
around each request. Task objects (often module-level in an app file, shared by apps) are never
changed by a deployment.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Sequence
from typing import Literal

from prismserve.task.context import PathLoad, Routing, current_request
from prismserve.task.errors import TaskUsageError
from prismserve.task.session import current_session, replayable_choice

__all__ = [
    "REPLICA_POLICIES",
    "ROUTING_POLICIES",
    "PathLoad",
    "Routing",
    "RoutingPolicy",
    "least_loaded_path",
    "planned_choice",
    "round_robin",
]

# How a deployment's replica is picked for an invocation: `static` (the fewest leases, round-robin
# among ties; no replica asked anything), `dynamic` (least loaded: each replica asked its queue
# depth) or `tokens` (the fewest pending tokens, ModServe's token-aware routing: counted by the task
# manager as leases come and go, from each invocation's `UnitTask.pending_tokens`).
# `path` is path-level dynamic routing: at a request's entry its whole path is chosen among the
# plan's paths for its type by the calls in flight the task managers already count
# (`least_loaded_path`), then followed statically (replicas as `static`); no replica is asked anything.
RoutingPolicy = Literal["static", "dynamic", "tokens", "path"]
ROUTING_POLICIES: tuple[RoutingPolicy, ...] = ("static", "dynamic", "tokens", "path")
# What an app may name for one deployment (`Config.replica_routing`): `path` chooses whole paths,
# which is the runtime's choice, not one deployment's.
REPLICA_POLICIES: tuple[RoutingPolicy, ...] = ("static", "dynamic", "tokens")

# Smooth weighted round-robin state per (key, weights): a deployment's new routing starts afresh.
_CREDITS: dict[tuple[Hashable, tuple[float, ...]], list[float]] = {}
_CREDITS_LOCK = threading.Lock()
_CREDITS_KEPT = 4096  # distinct (key, weights) remembered before the table is cleared


def planned_choice(
    key: Hashable, weights: Sequence[float], hops: Sequence[Sequence[tuple[str, float]]] | None = None
) -> int:
    """The path (index into `weights`) for the next request of `key` (e.g. its type), recorded as
    `replayable_choice` records its samples, so that replay follows it.

    `hops[i]`: path i's calls as (deployment key, the call's work). Given, and served
    with path-level routing (`serve --routing path`: the request's context has a `load`), the path
    is the least loaded of the plan's (`least_loaded_path`) instead of the plan's next.

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
    load = current_request().load
    if hops is not None and load is not None:
        chosen = least_loaded_path(key, weights, hops, load)
    else:
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


def least_loaded_path(
    key: Hashable, weights: Sequence[float], hops: Sequence[Sequence[tuple[str, float]]], load: PathLoad
) -> int:
    """Path-level dynamic routing: among the paths the plan uses (weight > 0), the one whose most
    loaded hop would be least loaded with this request on it; ties go by the plan's weights.

    `hops[i]`: path i's calls as (deployment key, the call's work: any unit, the same for every call
    of a deployment; 1 where nothing better is known). A hop's load is its deployment's backlog, its
    calls in flight times the mean work of the calls sent there (`_MEAN_WORK`, kept here), plus the
    call's own work, per running replica: all counted locally as calls go out, so choosing asks no
    replica anything (the queue queries are what made per-hop dynamic routing slow, 000 §7.4). Work,
    not calls: an encoder's call is a fraction of a second, an LLM's seconds. The most loaded hop,
    not the sum: a split path (encoder -> LLM) shares its LLM with the monolith path, and by the sum
    the monolith would always look lighter and the encoders would idle; by the bottleneck, work goes
    where it leaves the busiest deployment least busy, which is what balances the deployment.
    Ties (common while the counts are small) follow the plan's split by smooth weighted round-robin
    among the tied paths. A path with a deployment that has no running replica is never taken
    while another can be.
    """
    if len(hops) != len(weights):
        raise ValueError(f"{len(weights)} path weights but hops for {len(hops)} paths: give one per path")
    scores = [_bottleneck(path, load) if w > 0 else math.inf for path, w in zip(hops, weights, strict=True)]
    best = min(scores)
    if math.isinf(best):  # no planned path can run now: the plan's split (the lease will wait or fail)
        chosen = round_robin(key, weights)
    else:
        tied = [w if score <= best * (1 + 1e-9) else 0.0 for w, score in zip(weights, scores, strict=True)]
        chosen = round_robin(key, tied)
    _count_work(hops[chosen])
    return chosen


# Mean work of the calls path-level routing sent to each deployment (exponentially weighted over
# about the last `_WORK_WINDOW` calls): what a call in flight there is taken to cost.
_MEAN_WORK: dict[str, float] = {}
_WORK_WINDOW = 64


def _count_work(path: Sequence[tuple[str, float]]) -> None:
    """Fold a chosen path's calls into their deployments' mean work."""
    with _CREDITS_LOCK:
        if len(_MEAN_WORK) >= _CREDITS_KEPT:
            _MEAN_WORK.clear()
        for deployment, work in path:
            mean = _MEAN_WORK.get(deployment)
            _MEAN_WORK[deployment] = work if mean is None else mean + (work - mean) / _WORK_WINDOW


def _bottleneck(path: Sequence[tuple[str, float]], load: PathLoad) -> float:
    """The largest work per running replica among a path's deployments, its own calls added."""
    added: dict[str, float] = {}
    for deployment, work in path:
        added[deployment] = added.get(deployment, 0.0) + work
    worst = 0.0
    for deployment, work in added.items():
        calls, replicas = load(deployment)
        if replicas <= 0:
            return math.inf
        backlog = calls * _MEAN_WORK.get(deployment, work)
        worst = max(worst, (backlog + work) / replicas)
    return worst
