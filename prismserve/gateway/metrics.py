"""Prometheus metrics of one gateway (its own registry, no process-global state): the gateway's
own, each stage's as vLLM names an engine's (`prismserve:…`, from `runtime/stage_stats.py`), and
vLLM's own metrics (`vllm:…`, KV-cache use among them) read from each vLLM replica at the scrape."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from prismserve.control import Controls
from prismserve.runtime import Runtime
from prismserve.runtime.stage_stats import BUCKETS
from prismserve.runtime.stage_stats import Histogram as StageHistogram

log = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 2.0  # a replica slower than this to report is left out of this scrape

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)


class GatewayMetrics:
    """Requests, latencies per app and request type, per-deployment queue depth, and what the
    apps' control loops (`controls`) know: SLO attainment and goodput, re-planning, autoscaling."""

    def __init__(self, runtime: Runtime, controls: Controls) -> None:
        self.runtime = runtime
        self.controls = controls
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "prismserve_requests",
            "Requests served",
            ["app", "request_type", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "prismserve_request_latency_seconds",
            "Time from request to the end of its response",
            ["app", "request_type"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_chunk = Histogram(
            "prismserve_time_to_first_chunk_seconds",
            "Time from request to the first streamed chunk",
            ["app", "request_type"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_audio = Histogram(
            "prismserve_time_to_first_audio_seconds",
            "Time from request to the first chunk of speech",
            ["app", "request_type"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.real_time_factor = Histogram(
            "prismserve_speech_real_time_factor",
            "Seconds a request with speech took per second of speech (below 1: faster than it plays)",
            ["app", "request_type"],
            buckets=_RTF_BUCKETS,
            registry=self.registry,
        )
        self.slo_requests = Counter(
            "prismserve_slo_requests",
            "Requests of types with an SLO, by whether they met it (met, missed)",
            ["app", "request_type", "slo"],
            registry=self.registry,
        )
        self.goodput = Gauge(
            "prismserve_goodput_rps",
            "Requests that met their SLO per second, over the last 60 s",
            ["app"],
            registry=self.registry,
        )
        self.slo_attainment = Gauge(
            "prismserve_slo_attainment",
            "Share of the requests with an SLO that met it, over the last 60 s",
            ["app"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "prismserve_executor_queue_depth",
            "Invocations in flight per deployment",
            ["deployment"],
            registry=self.registry,
        )
        self.autoscale_replicas = Gauge(
            "prismserve_autoscale_replicas",
            "Replicas of each autoscaled stage in the deployed plan",
            ["app", "deployment"],
            registry=self.registry,
        )
        self.autoscale_load = Gauge(
            "prismserve_autoscale_load_tokens_per_second",
            "Tokens/s the calls of each autoscaled stage carried over the autoscaler's window",
            ["app", "deployment"],
            registry=self.registry,
        )
        self.autoscale_changes = Gauge(
            "prismserve_autoscale_changes",
            "Plans the autoscaler deployed since the gateway started",
            ["app"],
            registry=self.registry,
        )
        self.apps = Gauge("prismserve_apps_registered", "Registered apps", registry=self.registry)
        self.stages = StageCollector(runtime)
        self.registry.register(self.stages)
        self.replan_rate = Gauge(
            "prismserve_replan_observed_rps",
            "Requests/s arriving over the re-planning window",
            ["app"],
            registry=self.registry,
        )
        self.replan_share = Gauge(
            "prismserve_replan_observed_share",
            "Share of each request type over the re-planning window",
            ["app", "request_type"],
            registry=self.registry,
        )
        self.replan_capacity = Gauge(
            "prismserve_replan_capacity_rps",
            "Requests/s the deployed plan sustains at the observed mix (last check)",
            ["app"],
            registry=self.registry,
        )
        self.replan_drift = Gauge(
            "prismserve_replan_mix_drift",
            "Total variation distance between the observed mix and the deployed plan's (last check)",
            ["app"],
            registry=self.registry,
        )
        self.replans = Gauge(
            "prismserve_replans",
            "Re-plans deployed since the gateway started",
            ["app"],
            registry=self.registry,
        )
        self.last_replan = Gauge(
            "prismserve_replan_last_timestamp_seconds",
            "Unix time of the last re-plan (0: none yet)",
            ["app"],
            registry=self.registry,
        )

    async def scrape(self) -> bytes:
        """The text format, with vLLM's metrics read from its replicas now."""
        await self.stages.read_engines()
        return self.exposition()

    def exposition(self) -> bytes:
        """The text format, with the gauges read from the runtime now."""
        self.apps.set(len(self.runtime.registry.apps))
        self.queue_depth.clear()
        for key, depth in self.runtime.queue_depths().items():
            self.queue_depth.labels(deployment=key).set(depth)
        self._replanning()
        self._autoscaling()
        self.goodput.clear()
        self.slo_attainment.clear()
        for app, window in self.controls.slo_windows.items():
            self.goodput.labels(app).set(window.goodput())
            attainment = window.attainment()
            if attainment is not None:
                self.slo_attainment.labels(app).set(attainment)
        return generate_latest(self.registry)

    def slo_outcome(self, app: str, request_type: str, met: bool) -> None:
        """Count a request of a type with an SLO that ended, meeting it or not."""
        self.slo_requests.labels(app, request_type, "met" if met else "missed").inc()
        self.controls.slo_window(app).record(met)

    def _autoscaling(self) -> None:
        """The autoscalers' gauges, read now."""
        for gauge in (self.autoscale_replicas, self.autoscale_load, self.autoscale_changes):
            gauge.clear()
        for app, scaler in self.controls.autoscalers.items():
            status = scaler.status()
            for name, replicas in status.replicas.items():
                self.autoscale_replicas.labels(app, name).set(replicas)
            for name, rate in status.load.items():
                self.autoscale_load.labels(app, name).set(rate)
            self.autoscale_changes.labels(app).set(status.changes)

    def _replanning(self) -> None:
        """The re-planning watchers' gauges, read now."""
        for gauge in (self.replan_rate, self.replan_share, self.replan_capacity, self.replan_drift):
            gauge.clear()
        for app, replanner in self.controls.replanners.items():
            status = replanner.status()
            self.replan_rate.labels(app).set(status.rate)
            for request_type, share in status.shares.items():
                self.replan_share.labels(app, request_type).set(share)
            if status.capacity is not None:
                self.replan_capacity.labels(app).set(status.capacity)
            if status.drift is not None:
                self.replan_drift.labels(app).set(status.drift)
            self.replans.labels(app).set(status.replans)
            self.last_replan.labels(app).set(status.last_replan_wall_time or 0.0)


class StageCollector:
    """Each deployment's figures under vLLM's names and labels (`prismserve:` for `vllm:`), labelled
    by `deployment` (its key), `stage` (its unit task's class) and `model_name`; then the `vllm:`
    families of every vLLM replica, with `deployment` and `replica` added to their labels."""

    LABELS = ("deployment", "stage", "model_name")

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.engines: list[Metric] = []

    async def read_engines(self) -> None:
        """Read vLLM's own metrics from each running replica of a vLLM deployment."""
        reads = []
        for key, manager in self.runtime.stages().items():
            ref = type(manager.task).executor_ref
            if ref is None or ref.env != "vllm" or manager.spec.backend != "model":
                continue
            reads += [(key, replica) for replica in manager.replicas if replica.up and replica.address]
        texts = await asyncio.gather(*(_engine_metrics(replica) for _, replica in reads))
        self.engines = []
        for (key, replica), text in zip(reads, texts, strict=True):
            for family in text_string_to_metric_families(text or ""):
                if family.name.startswith("vllm:"):
                    extra = {"deployment": key, "replica": str(replica.id)}
                    family.samples = [s._replace(labels={**s.labels, **extra}) for s in family.samples]
                    self.engines.append(family)

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "prismserve:num_requests_running", "Calls in flight on the stage's replicas", labels=self.LABELS
        )
        waiting = GaugeMetricFamily(
            "prismserve:num_requests_waiting",
            "Calls waiting for a replica of the stage to be up",
            labels=self.LABELS,
        )
        replicas = GaugeMetricFamily(
            "prismserve:num_replicas_running", "Replicas of the stage up", labels=self.LABELS
        )
        prompt = CounterMetricFamily(
            "prismserve:prompt_tokens", "Prompt tokens the stage's engine reported", labels=self.LABELS
        )
        generated = CounterMetricFamily(
            "prismserve:generation_tokens", "Tokens the stage generated", labels=self.LABELS
        )
        histograms = {
            "time_to_first_token": HistogramMetricFamily(
                "prismserve:time_to_first_token_seconds",
                "From a call's sending to its first token",
                labels=self.LABELS,
            ),
            "time_per_output_token": HistogramMetricFamily(
                "prismserve:time_per_output_token_seconds",
                "Per call, mean time between tokens after the first",
                labels=self.LABELS,
            ),
            "time_to_first_audio": HistogramMetricFamily(
                "prismserve:time_to_first_audio_seconds",
                "From a call's sending to its first audio",
                labels=self.LABELS,
            ),
        }
        for key, manager in self.runtime.stages().items():
            labels = [key, type(manager.task).__name__, str(getattr(manager.task, "model", "") or "")]
            stats = manager.stats
            running.add_metric(labels, manager.queue_depth())
            waiting.add_metric(labels, stats.waiting)
            replicas.add_metric(labels, sum(1 for r in manager.replicas if r.up))
            prompt.add_metric(labels, stats.prompt_tokens)
            generated.add_metric(labels, stats.generation_tokens)
            for name, family in histograms.items():
                histogram = getattr(stats, name)
                family.add_metric(labels, _buckets(histogram), histogram.sum)
        yield from (running, waiting, replicas, prompt, generated, *histograms.values(), *self.engines)


def _buckets(histogram: StageHistogram) -> list[tuple[str, float]]:
    """Cumulative bucket counts as Prometheus writes them (`le` bounds, then +Inf)."""
    cumulative: list[tuple[str, float]] = []
    total = 0
    for bound, count in zip((*map(str, BUCKETS), "+Inf"), histogram.counts, strict=True):
        total += count
        cumulative.append((bound, total))
    return cumulative


async def _engine_metrics(replica: Any) -> str | None:
    """A vLLM replica's metrics in the text format; None when it does not answer in time."""
    from prismserve.runtime.wire import connection

    with contextlib.suppress(Exception):  # a replica restarting or slow: out of this scrape only
        return await asyncio.wait_for(connection(replica.address).request("metrics"), SCRAPE_TIMEOUT_S)
    log.debug("replica %s left out of the metrics scrape", replica.id)
    return None
