"""Load-run metrics: throughput over the makespan, steady capacity, percentiles, goodput."""

from __future__ import annotations

import pytest

from prismserve.bench.loadgen import RequestResult
from prismserve.bench.metrics import GoodputLimits, summarize


def result(kind: str, sent: float, done: float, tokens: list[float] = (), ok: bool = True) -> RequestResult:
    return RequestResult(
        kind, sent, sent_s=sent, done_s=done, ok=ok, status=200 if ok else 502, token_s=list(tokens)
    )


def test_throughput_latency_and_types():
    results = [result("text", i, i + 1 + i % 2, [i + 0.5, i + 0.7]) for i in range(10)]
    results.append(result("image+text", 10, 14, ok=False))
    summary = summarize(results, warmup=2)
    assert summary["requests"] == 9 and summary["completed"] == 8 and summary["failed"] == 1
    # Measured requests were sent from t=2; the last measured one ended at 14.
    assert summary["makespan_s"] == pytest.approx(12)
    assert summary["throughput_rps"] == pytest.approx(8 / 12)
    assert summary["latency_s"]["p50"] == pytest.approx(1.5)
    assert summary["ttft_s"]["p50"] == pytest.approx(0.5)
    assert summary["tbt_s"]["p50"] == pytest.approx(0.2)
    assert summary["by_type"]["image+text"]["completed"] == 0
    assert summary["errors"] == ["HTTP 502"]


def test_steady_rate_leaves_out_ramp_up_and_down():
    # Completions every 0.1 s in the middle, but slow at both edges.
    done = [0.0, 3.0] + [3.0 + 0.1 * k for k in range(1, 41)] + [20.0, 30.0]
    results = [result("text", 0.0, d) for d in done]
    summary = summarize(results, warmup=2)
    assert summary["steady_rps"] == pytest.approx(10.0, rel=0.03)
    assert summary["throughput_rps"] < 2


def test_goodput_counts_requests_within_every_slo():
    results = [
        result("text", 0, 1.0, [0.2, 0.3]),  # meets all
        result("text", 0, 3.0, [0.2, 0.3]),  # too slow overall
        result("text", 0, 1.0, [0.9, 0.95]),  # first token too late
        result("text", 0, 1.0, [0.1, 0.9]),  # tokens too far apart
    ]
    summary = summarize(results, slo=GoodputLimits(latency_s=2.0, ttft_s=0.5, tbt_s=0.5))
    assert summary["slo_attainment"] == pytest.approx(0.25)
    assert summary["goodput_rps"] == pytest.approx(1 / 3)
    assert summary["slo"] == {"latency_s": 2.0, "ttft_s": 0.5, "tbt_s": 0.5}


def test_no_measured_requests_is_an_error():
    with pytest.raises(ValueError, match="no requests left"):
        summarize([result("text", 0, 1)], warmup=1)
