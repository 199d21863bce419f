"""Measuring an app's deployments on the hardware at hand: replica seconds per request of each type.

A replica's time for a request is read from its busy time (seconds with at least one call in hand,
kept by its leases: a streaming call's until its streams end) while rounds of `batch` requests of one type run together, so what is measured
is the time per request at the batch the executor forms under load, not one request's latency.
The first round of each type warms the replicas up (compilation, caches) and is not counted; a
request the app refuses there as the request's fault (a prompt longer than the model's context) is
left out of the rounds, and a type whose every request is refused is not measured.
While measuring, a consumer's replica is leased once its producers' results exist (as `dynamic`
routing does), not when the request is dispatched: a lease held while the producer still works
would count the producer's time as the consumer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from prismserve.app import App
from prismserve.errors import InvalidRequestError
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.base import Runtime
from prismserve.task import Stream
from prismserve.task.routing import Routing

log = logging.getLogger(__name__)


async def serve_one(runtime: Runtime, app: App, request: ChatRequest, routing: Routing | None = None) -> None:
    """Serve one request to its end (a stream read to its last chunk); `routing` instead of the plan's."""
    async with runtime.request(app.name, request.request_type, routing=routing):
        result: Any = await app.serve(request)
        if app.streaming:
            async for _ in result:
                pass
        else:  # an answer holding streams is not served until they are read
            for value in vars(result).values():
                if isinstance(value, Stream):
                    await value.collect()


def busy(runtime: Any) -> dict[str, tuple[float, int]]:
    """Busy seconds and calls so far of each deployment's replicas, by deployment key (a replica busy
    now counts its time up to now)."""
    now = time.perf_counter()
    return {
        key: (
            sum(r.busy_s + (now - r.busy_since if r.in_flight else 0.0) for r in m.replicas),
            sum(r.calls for r in m.replicas),
        )
        for key, m in runtime.managers.items()
    }


@contextlib.contextmanager
def leased_when_inputs_exist(runtime: Any) -> Iterator[None]:
    """Inside the block, consumers' replicas are leased once their inputs exist (`dynamic` routing
    wherever `static` was in force); every policy is put back after."""
    dispatcher = getattr(runtime, "dispatcher", None)
    managers = list(getattr(runtime, "managers", {}).values())
    saved = (getattr(dispatcher, "policy", None), [m.policy for m in managers])
    if saved[0] == "static":
        dispatcher.policy = "dynamic"  # type: ignore[union-attr]  # it has a policy
    for manager in managers:
        if manager.policy == "static":
            manager.policy = "dynamic"
    try:
        yield
    finally:
        if saved[0] is not None:
            dispatcher.policy = saved[0]  # type: ignore[union-attr]
        for manager, policy in zip(managers, saved[1], strict=True):
            manager.policy = policy


def cpu_busy() -> float:
    """CPU-seconds this machine has spent on anything (every core, every process) so far."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


async def seconds_per_request(
    runtime: Any,
    app: App,
    requests: Mapping[str, list[ChatRequest]],
    batch: int,
    rounds: int,
    routing: Routing | None = None,
    warm_up: bool = True,
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Request type -> deployment key -> replica seconds per request of that type (measured), and
    request type -> CPU-seconds the machine spent per request of that type; a type the app refused
    every request of is in neither (logged). With `routing`, every
    request follows it instead of the deployed plan's; without `warm_up`, no round is left out
    (the replicas ran the same requests just before)."""
    measured: dict[str, dict[str, float]] = {}
    cpu: dict[str, float] = {}
    first = 0 if warm_up else 1
    with leased_when_inputs_exist(runtime):
        for request_type, examples in requests.items():
            await _measure_type(
                runtime, app, request_type, examples, batch, rounds, first, routing, measured, cpu
            )
    return measured, cpu


async def _measure_type(
    runtime: Any,
    app: App,
    request_type: str,
    examples: list[ChatRequest],
    batch: int,
    rounds: int,
    first: int,
    routing: Routing | None,
    measured: dict[str, dict[str, float]],
    cpu: dict[str, float],
) -> None:
    """Rounds `first`..`rounds` of `request_type` (round 0 a warm-up), added to `measured` and `cpu`."""
    if first == 0:
        examples = await _warm_up(runtime, app, request_type, examples, routing)
    for index in range(1, rounds + 1 if examples else 1):
        chosen = [examples[(index * batch + i) % len(examples)] for i in range(batch)]
        before, started = busy(runtime), cpu_busy()
        await asyncio.gather(*(serve_one(runtime, app, r, routing) for r in chosen))
        after = busy(runtime)
        cpu[request_type] = cpu.get(request_type, 0.0) + (cpu_busy() - started) / (batch * rounds)
        for key, (seconds, calls) in after.items():
            spent = seconds - before.get(key, (0.0, 0))[0]
            if calls > before.get(key, (0.0, 0))[1]:
                row = measured.setdefault(request_type, {})
                row[key] = row.get(key, 0.0) + spent / (batch * rounds)


async def _warm_up(
    runtime: Any, app: App, request_type: str, examples: list[ChatRequest], routing: Routing | None
) -> list[ChatRequest]:
    """Serve each example once (the replicas' warm-up); the examples the app did not refuse. A refusal
    is the request's fault (a workload written for a larger model), so it is logged and left out, and
    any other failure is raised."""
    outcomes = await asyncio.gather(
        *(serve_one(runtime, app, r, routing) for r in examples), return_exceptions=True
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, InvalidRequestError):
            raise outcome
    refused = [str(o) for o in outcomes if isinstance(o, InvalidRequestError)]
    if refused:
        left = "the type is not profiled" if len(refused) == len(examples) else "it is left out"
        log.warning(
            "app %r refused %d of %d %s requests of the profile's workload (%s): %s",
            app.name, len(refused), len(examples), request_type, refused[0], left,
        )  # fmt: skip
    return [r for r, o in zip(examples, outcomes, strict=True) if not isinstance(o, BaseException)]
