"""Prometheus metrics of one gateway (its own registry, no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from prismserve.control import Controls
from prismserve.runtime import Runtime

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


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
