"""Traces and metrics: a span per request that executor spans nest under, OTLP export, Prometheus."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest
from gateway_apps import ADMIN, ANSWER, OMNI, TOKEN, chat_body
from metrics_helpers import dashboard_metrics, exported
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from toy.executors import EXECUTORS

from prismserve.gateway import create_gateway
from prismserve.observability import extract_context, get_tracer, inject_context, setup_tracing
from prismserve.runtime import LocalRuntime


@pytest.fixture
def traced(serve_gateway):
    """A gateway whose spans, and its executors' spans, go to an in-memory exporter (no global provider)."""
    exporter = InMemorySpanExporter()
    provider = setup_tracing("gateway-test", exporter=exporter, install=False)
    tracer = get_tracer("test-executors", provider)

    async def traced_llm(task, request):
        with tracer.start_as_current_span("executor.llm"):
            if "crash" in request.prompt:
                raise RuntimeError("executor crashed")
            async for token in EXECUTORS["llm"](task, request):
                yield token

    runtime = LocalRuntime({**EXECUTORS, "llm": traced_llm})
    app = create_gateway(runtime, admin_token=TOKEN, tracer_provider=provider)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for name, source in (("omni", OMNI), ("answer", ANSWER)):
            assert (
                client.post("/admin/apps", json={"name": name, "source": source}, headers=ADMIN).status_code
                == 201
            )
        yield client, exporter


def test_a_request_makes_one_trace_with_executor_spans_under_the_gateway_span(traced, span_exporter):
    # span_exporter: the process's global provider is installed whatever ran before, so the
    # replica's own `execute` span (global tracer) always sits between the two: the walk is the same.
    client, exporter = traced
    response = client.post(
        "/v1/apps/answer/invoke", json=chat_body("trace me"), headers={"x-request-id": "req-1"}
    )
    assert response.status_code == 200
    spans = {span.name: span for span in exporter.get_finished_spans()}
    request, executor = spans["prismserve.request"], spans["executor.llm"]
    assert dict(request.attributes) == {
        "prismserve.app": "answer",
        "prismserve.request_type": "text",
        "prismserve.request_id": "req-1",
    }
    assert executor.context.trace_id == request.context.trace_id
    known = {
        s.context.span_id: s for s in [*exporter.get_finished_spans(), *span_exporter.get_finished_spans()]
    }
    ancestors, span = [], executor
    while span.parent is not None and span.parent.span_id in known:
        span = known[span.parent.span_id]
        ancestors.append(span.name)
    assert ancestors.index("execute LLMTask") < ancestors.index("prismserve.request"), ancestors


def test_a_callers_traceparent_is_continued_by_the_request_span(traced):
    """A request carrying W3C `traceparent` (a traced client, a proxy) is one more span of the
    caller's trace, under the caller's span; one without starts a trace of its own."""
    client, exporter = traced
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    assert client.post("/v1/apps/answer/invoke", json=chat_body("joined"), headers=headers).status_code == 200
    assert client.post("/v1/apps/answer/invoke", json=chat_body("alone")).status_code == 200
    joined, alone = [s for s in exporter.get_finished_spans() if s.name == "prismserve.request"]
    assert f"{joined.context.trace_id:032x}" == trace_id and f"{joined.parent.span_id:016x}" == parent_id
    assert f"{alone.context.trace_id:032x}" != trace_id and alone.parent is None


def test_streamed_and_failed_requests_are_traced_too(traced):
    client, exporter = traced
    with client.stream("POST", "/v1/apps/omni/invoke", json=chat_body("streamed")) as response:
        list(response.iter_lines())
    crash = {"model": "answer", "messages": [{"role": "user", "content": "crash"}]}
    assert client.post("/v1/chat/completions", json=crash).status_code == 502
    requests = [s for s in exporter.get_finished_spans() if s.name == "prismserve.request"]
    assert [s.attributes["prismserve.app"] for s in requests] == ["omni", "answer"]
    assert len({s.context.trace_id for s in requests}) == 2  # one trace per request
    assert requests[0].status.is_ok and requests[1].status.status_code is StatusCode.ERROR
    assert "executor crashed" in requests[1].status.description


def test_trace_context_crosses_a_process_boundary_as_a_dict():
    exporter = InMemorySpanExporter()
    tracer = get_tracer("test", setup_tracing("t", exporter=exporter, install=False))
    assert inject_context() == {}  # nothing recorded, nothing sent
    with tracer.start_as_current_span("caller") as caller:
        carrier = inject_context()
    assert set(carrier) == {"traceparent"} and all(isinstance(v, str) for v in carrier.values())
    with tracer.start_as_current_span(
        "remote", context=extract_context(json.loads(json.dumps(carrier)))
    ) as remote:
        pass
    assert remote.context.trace_id == caller.context.trace_id
    assert remote.parent.span_id == caller.context.span_id
    assert extract_context({}) is None


def test_setup_tracing_sends_spans_over_otlp_http_when_an_endpoint_is_set(monkeypatch):
    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            received.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    collector = HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        assert setup_tracing("t", install=False) is None  # nothing configured, nothing set up
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_port}")
        provider = setup_tracing("otlp-test", install=False)
        with get_tracer("test", provider).start_as_current_span("exported-span"):
            pass
        assert provider.force_flush(10_000)
        provider.shutdown()
    finally:
        collector.shutdown()
        thread.join(5)
    assert [path for path, _ in received] == ["/v1/traces"]
    assert b"exported-span" in received[0][1] and b"otlp-test" in received[0][1]


class _BusyRuntime(LocalRuntime):
    """A LocalRuntime that reports fixed queue depths, as a runtime with replicas does."""

    def queue_depths(self) -> dict[str, int]:
        return {"toy.tasks.LLMTask:abc": 3, "toy.tasks.EncoderTask:def": 0}


def test_metrics_read_queue_depths_from_the_runtime_at_scrape_time(serve_gateway):
    app = create_gateway(_BusyRuntime(EXECUTORS), admin_token=TOKEN)
    with serve_gateway(app) as url:
        text = httpx.get(f"{url}/metrics").text
    assert 'prismserve_executor_queue_depth{deployment="toy.tasks.LLMTask:abc"} 3.0' in text
    assert 'prismserve_executor_queue_depth{deployment="toy.tasks.EncoderTask:def"} 0.0' in text
    assert "prismserve_apps_registered 0.0" in text


def test_two_gateways_keep_separate_metrics(serve_gateway):
    first = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN)
    second = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN)
    with serve_gateway(first) as one, serve_gateway(second) as two:
        assert (
            httpx.post(
                f"{one}/admin/apps", json={"name": "answer", "source": ANSWER}, headers=ADMIN
            ).status_code
            == 201
        )
        assert httpx.post(f"{one}/v1/apps/answer/invoke", json=chat_body("hi")).status_code == 200
        assert 'prismserve_requests_total{app="answer"' in httpx.get(f"{one}/metrics").text
        assert "prismserve_requests_total{" not in httpx.get(f"{two}/metrics").text


def test_goodput_and_slo_attainment_count_the_requests_that_met_their_slo(serve_gateway):
    """Requests of a type with an SLO are counted as meeting it or not, per app; goodput and
    attainment gauges read the last minute of them."""
    app = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN)
    lenient = ANSWER.replace("    tasks =", '    slos = {"text": {"ttft_s": 30, "e2e_s": 30}}\n    tasks =')
    strict = ANSWER.replace("    tasks =", '    slos = {"default": {"e2e_s": 0.000001}}\n    tasks =')
    with serve_gateway(app) as url:
        for name, source in (("lenient", lenient), ("strict", strict), ("none", ANSWER)):
            response = httpx.post(f"{url}/admin/apps", json={"name": name, "source": source}, headers=ADMIN)
            assert response.status_code == 201, response.text
        for name in ("lenient", "lenient", "strict", "none"):
            assert httpx.post(f"{url}/v1/apps/{name}/invoke", json=chat_body("hi")).status_code == 200
        text = httpx.get(f"{url}/metrics").text
    assert 'prismserve_slo_requests_total{app="lenient",request_type="text",slo="met"} 2.0' in text
    assert 'prismserve_slo_requests_total{app="strict",request_type="text",slo="missed"} 1.0' in text
    assert 'prismserve_slo_attainment{app="lenient"} 1.0' in text
    assert 'prismserve_slo_attainment{app="strict"} 0.0' in text
    goodput = [line for line in text.splitlines() if line.startswith("prismserve_goodput_rps{")]
    assert len(goodput) == 2 and float(goodput[0].split()[-1]) > 0 and goodput[1].endswith(" 0.0")
    assert 'app="none"' not in "".join(
        line for line in text.splitlines() if "slo" in line or "goodput" in line
    )


@pytest.mark.fresh_gateway
def test_each_stage_is_measured_under_vllms_names_and_the_dashboard_reads_what_the_gateway_exports(gateway):
    """Per stage: calls running, time to first token, time per output token and generated tokens
    for the LLM; time to first audio for the vocoder; the gateway's and the stages' metrics the
    dashboard reads are all exported (vLLM's own: tests/cli/test_serve_model.py)."""
    assert gateway.post("/v1/apps/answer/invoke", json=chat_body("four words are here")).status_code == 200
    spoken = {
        "model": "omni",
        "modalities": ["text", "audio"],
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert gateway.post("/v1/chat/completions", json=spoken).status_code == 200
    samples = exported(gateway.get("/metrics").text)

    def value(name, stage):
        return sum(s.value for s in samples[name] if s.labels["stage"] == stage)

    assert value("prismserve:time_to_first_token_seconds_count", "LLMTask") >= 2
    assert value("prismserve:time_per_output_token_seconds_count", "LLMTask") >= 2
    assert value("prismserve:generation_tokens_total", "LLMTask") >= 4
    assert value("prismserve:time_to_first_audio_seconds_count", "VocoderTask") == 1
    (rtf,) = [s for s in samples["prismserve_speech_real_time_factor_count"] if s.labels["app"] == "omni"]
    (first_audio,) = [
        s for s in samples["prismserve_time_to_first_audio_seconds_count"] if s.labels["app"] == "omni"
    ]
    assert rtf.value == first_audio.value == 1  # the spoken answer only
    assert value("prismserve:num_requests_running", "LLMTask") == 0  # all answered
    (bound,) = {s.labels["le"] for s in samples["prismserve:time_to_first_token_seconds_bucket"]} & {"1800.0"}
    assert bound
    ours = {name for name in dashboard_metrics() if not name.startswith("vllm:")}
    assert ours and ours <= set(samples), sorted(ours - set(samples))
