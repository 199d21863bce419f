"""Metrics of a load run: throughput, latency percentiles (overall and per type), TTFT, TBT, goodput."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prismserve.bench.loadgen import RequestResult

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class GoodputLimits:
    """Limits a request must meet to count toward goodput; None means no limit."""

    latency_s: float | None = None
    ttft_s: float | None = None
    tbt_s: float | None = None  # on the mean time between tokens of the request

    def met(self, result: RequestResult) -> bool:
        """Whether `result` succeeded within every limit."""
        if not result.ok:
            return False
        if self.latency_s is not None and result.latency_s > self.latency_s:
            return False
        if self.ttft_s is not None and (result.ttft_s is None or result.ttft_s > self.ttft_s):
            return False
        gaps = np.diff(result.token_s)
        return self.tbt_s is None or not len(gaps) or float(gaps.mean()) <= self.tbt_s


def percentiles(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """p50/p90/p95/p99 and mean (None when there are no values)."""
    if len(values) == 0:
        return {**{f"p{p}": None for p in PERCENTILES}, "mean": None}
    array = np.asarray(values, dtype=float)
    return {**{f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES}, "mean": float(array.mean())}


def summarize(
    results: list[RequestResult], warmup: int = 0, slo: GoodputLimits | None = None
) -> dict[str, Any]:
    """Metrics over the requests after the first `warmup` (by arrival).

    `throughput_rps` is completed requests / makespan, the makespan running from the first measured
    request's send to the last measured request's end (000 §7.1); it includes the ramp-down, when
    the last requests drain with the server less than full. `steady_rps` leaves out the first and
    the last `warmup` completions (ramp-up and ramp-down) and divides the completions between them
    by the time they took: under overload, the server's capacity.
    """
    ordered = sorted(results, key=lambda r: r.arrival_s)
    measured = ordered[warmup:]
    if not measured:
        raise ValueError(f"no requests left after a warm-up of {warmup}")
    ok = [r for r in measured if r.ok]
    makespan = max(r.done_s for r in measured) - min(r.sent_s for r in measured)
    slo = slo or GoodputLimits()
    good = [r for r in ok if slo.met(r)]
    gaps = [g for r in ok for g in np.diff(r.token_s)]
    summary: dict[str, Any] = {
        "requests": len(measured),
        "completed": len(ok),
        "failed": len(measured) - len(ok),
        "errors": sorted({r.error or f"HTTP {r.status}" for r in measured if not r.ok})[:5],
        "warmup": warmup,
        "makespan_s": makespan,
        "offered_rps": _offered(measured),
        "throughput_rps": len(ok) / makespan if makespan > 0 else 0.0,
        "steady_rps": _steady(ok, max(warmup, 1)),
        "goodput_rps": len(good) / makespan if makespan > 0 else 0.0,
        "slo": {k: v for k, v in vars(slo).items() if v is not None},
        "slo_attainment": len(good) / len(measured),
        "latency_s": percentiles([r.latency_s for r in ok]),
        "ttft_s": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tbt_s": percentiles(gaps),
        "by_type": {},
    }
    for request_type in sorted({r.request_type for r in measured}):
        mine = [r for r in measured if r.request_type == request_type]
        mine_ok = [r for r in mine if r.ok]
        summary["by_type"][request_type] = {
            "requests": len(mine),
            "completed": len(mine_ok),
            "latency_s": percentiles([r.latency_s for r in mine_ok]),
            "ttft_s": percentiles([r.ttft_s for r in mine_ok if r.ttft_s is not None]),
        }
    return summary


def _steady(ok: list[RequestResult], edge: int) -> float:
    done = sorted(r.done_s for r in ok)
    if len(done) <= 2 * edge + 1:
        return 0.0
    first, last = done[edge], done[len(done) - 1 - edge]
    return (len(done) - 1 - 2 * edge) / (last - first) if last > first else 0.0


def _offered(results: list[RequestResult]) -> float:
    span = max(r.arrival_s for r in results) - min(r.arrival_s for r in results)
    return (len(results) - 1) / span if span > 0 else float("inf")
