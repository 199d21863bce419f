"""Prometheus metrics of one gateway (its own registry, no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from prismserve.runtime import Runtime

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """Requests, latencies per app and request type, and per-deployment queue depth."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
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
        self.queue_depth = Gauge(
            "prismserve_executor_queue_depth",
            "Invocations in flight per deployment",
            ["deployment"],
            registry=self.registry,
        )
        self.apps = Gauge("prismserve_apps_registered", "Registered apps", registry=self.registry)

    def exposition(self) -> bytes:
        """The text format, with the gauges read from the runtime now."""
        self.apps.set(len(self.runtime.registry.apps))
        self.queue_depth.clear()
        for key, depth in self.runtime.queue_depths().items():
            self.queue_depth.labels(deployment=key).set(depth)
        return generate_latest(self.registry)
