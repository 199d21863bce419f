"""OpenTelemetry tracing: one trace per request across gateway, dispatcher and executor replicas.

Spans are created through the OpenTelemetry API everywhere; they are recorded only once a tracer
provider is installed (`setup_tracing`). Work that leaves the process carries the trace context
in a plain dict (`inject_context` on the sending side, `extract_context` on the receiving side),
so spans made by executor replicas join the request's trace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

OTLP_ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"


def setup_tracing(
    service_name: str = "prismserve",
    *,
    otlp_endpoint: str | None = None,
    exporter: SpanExporter | None = None,
    install: bool = True,
) -> TracerProvider | None:
    """A tracer provider exporting to `exporter`, or over OTLP/HTTP to `otlp_endpoint`.

    Without either (and without OTEL_EXPORTER_OTLP_ENDPOINT in the environment) nothing is set up
    and None is returned. With `install` the provider becomes the process's global one (the
    OpenTelemetry API allows that once per process); without it nothing global changes and the
    caller passes the provider on (`create_gateway(..., tracer_provider=...)`).
    """
    otlp_endpoint = otlp_endpoint or os.environ.get(OTLP_ENDPOINT_VARIABLE)
    processor: SpanProcessor
    if exporter is not None:
        processor = SimpleSpanProcessor(exporter)
    elif otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_endpoint(otlp_endpoint)))
    else:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(processor)
    if install:
        trace.set_tracer_provider(provider)
    return provider


def traces_endpoint(otlp_endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a collector's base URL (`http://host:4318` → `…/v1/traces`)."""
    endpoint = otlp_endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def get_tracer(name: str, provider: trace.TracerProvider | None = None) -> trace.Tracer:
    """A tracer from `provider`, or from the process's global provider (a no-op one until set up)."""
    return (provider or trace.get_tracer_provider()).get_tracer(name)


def inject_context(context: Context | None = None) -> dict[str, str]:
    """The current (or given) trace context as a small dict of strings to send with a remote call.

    Empty when no span is being recorded, so untraced calls carry nothing.
    """
    carrier: dict[str, str] = {}
    if context is not None or trace.get_current_span().is_recording():
        propagate.inject(carrier, context=context)
    return carrier


def extract_context(carrier: Mapping[str, str] | None) -> Context | None:
    """The trace context a remote caller sent (`inject_context`); spans started under it join its trace.

    Use as `tracer.start_as_current_span(name, context=extract_context(carrier))`; None when the
    caller sent nothing, which starts a new trace.
    """
    if not carrier:
        return None
    return propagate.extract(dict(carrier))
