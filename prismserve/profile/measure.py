"""Measuring an app's deployments on the hardware at hand: replica seconds per request of each type.

A replica's time for a request is read from its busy time (seconds with at least one call in hand,
kept by its leases) while rounds of `batch` requests of one type run together, so what is measured
is the time per request at the batch the executor forms under load, not one request's latency.
The first round of each type warms the replicas up (compilation, caches) and is not counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from prismserve.app import App
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.base import Runtime
from prismserve.task import Stream


async def serve_one(runtime: Runtime, app: App, request: ChatRequest) -> None:
    """Serve one request to its end (a stream read to its last chunk)."""
    async with runtime.request(app.name, request.request_type):
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
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Request type -> deployment key -> replica seconds per request of that type (measured), and
    request type -> CPU-seconds the machine spent per request of that type."""
    measured: dict[str, dict[str, float]] = {}
    cpu: dict[str, float] = {}
    for request_type, examples in requests.items():
        for index in range(rounds + 1):
            chosen = [examples[(index * batch + i) % len(examples)] for i in range(batch)]
            before, started = busy(runtime), cpu_busy()
            await asyncio.gather(*(serve_one(runtime, app, r) for r in chosen))
            if index == 0:
                continue  # warm-up
            after = busy(runtime)
            cpu[request_type] = cpu.get(request_type, 0.0) + (cpu_busy() - started) / (batch * rounds)
            for key, (seconds, calls) in after.items():
                spent = seconds - before.get(key, (0.0, 0))[0]
                if calls > before.get(key, (0.0, 0))[1]:
                    row = measured.setdefault(request_type, {})
                    row[key] = row.get(key, 0.0) + spent / (batch * rounds)
    return measured, cpu
