"""OpenTelemetry tracing: one trace per request across gateway, dispatcher and executor replicas.

Spans are created through the OpenTelemetry API everywhere; they are recorded only once a tracer
provider is installed (`setup_tracing`). The dispatcher passes the trace context to replicas with
each call, so their spans join the request's trace.
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter


def setup_tracing(
    service_name: str = "prismserve",
    *,
    otlp_endpoint: str | None = None,
    exporter: SpanExporter | None = None,
    install: bool = True,
) -> TracerProvider | None:
    """A tracer provider exporting to `exporter`, or over OTLP/HTTP to `otlp_endpoint`.

    Without either (and without OTEL_EXPORTER_OTLP_ENDPOINT in the environment) nothing is set up
    and None is returned. With `install` the provider becomes the process's global one.
    """
    otlp_endpoint = otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if exporter is None and not otlp_endpoint:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = otlp_endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if install:
        trace.set_tracer_provider(provider)
    return provider
