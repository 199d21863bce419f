"""Faults and limits: errors mid-stream, executor crashes under concurrency, body limits, request ids."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from gateway_apps import ADMIN, OMNI, TOKEN, chat_body, sse_events
from toy.executors import EXECUTORS

from prismserve.gateway import create_gateway
from prismserve.runtime import LocalRuntime


@pytest.mark.reliability
def test_an_executor_failure_mid_stream_ends_the_stream_with_an_error_event(gateway):
    with gateway.stream("POST", "/v1/apps/omni/invoke", json=chat_body("fail midway please")) as response:
        assert response.status_code == 200  # the first chunks were already on their way
        events = sse_events(response.iter_lines())
    chunks = [json.loads(data)["text"] for event, data in events if event is None]
    assert chunks == ["[0 media, 0.000]", " user:"]
    (event, data), *_ = [e for e in events if e[0] == "error"]
    error = json.loads(data)["error"]
    assert (
        error["type"] == "executor_error"
        and "call #" in error["message"]
        and "(LLMTask) failed;" in error["message"]
    )
    assert "replica lost mid-stream" not in error["message"]  # the log has it, under error["request_id"]
    assert ("", "[DONE]") not in events and (None, "[DONE]") not in events
    assert gateway.post("/v1/apps/answer/invoke", json=chat_body("next one")).status_code == 200


def test_openai_client_sees_a_mid_stream_failure_as_an_api_error(chat):
    stream = chat.chat.completions.create(
        model="omni", messages=[{"role": "user", "content": "fail midway"}], stream=True
    )
    received = []
    with pytest.raises(openai.APIError, match=r"\(LLMTask\) failed; the gateway's log has the details"):
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "[0 media, 0.000] user:"


@pytest.mark.reliability
def test_a_crashing_request_loses_no_concurrent_request(gateway):
    def ask(i: int) -> tuple[int, int, str]:
        text = "please crash" if i % 4 == 0 else f"question {i}"
        response = gateway.post("/v1/apps/answer/invoke", json=chat_body(text))
        return i, response.status_code, response.text

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(24)))
    for i, status, body in results:
        if i % 4 == 0:
            assert status == 502 and "(LLMTask) failed;" in body
        else:
            assert status == 200 and json.loads(body)["text"].endswith(f"user: question {i}")


@pytest.mark.reliability
def test_a_slow_consumer_holds_up_no_other_request_and_gets_its_whole_stream(gateway):
    """A client that stops reading its stream for a while: other requests are answered meanwhile
    as quickly as without it, and its own stream then arrives whole."""
    words = " ".join(f"w{i}" for i in range(400))
    with gateway.stream("POST", "/v1/apps/omni/invoke", json=chat_body(words)) as slow:
        lines = slow.iter_lines()
        first = next(lines)
        took = []
        for i in range(5):  # while the slow client reads nothing
            start = time.perf_counter()
            answer = gateway.post("/v1/apps/answer/invoke", json=chat_body(f"meanwhile {i}"))
            took.append(time.perf_counter() - start)
            assert answer.status_code == 200 and json.loads(answer.text)["text"].endswith(f"meanwhile {i}")
        rest = [first, *lines]
    texts = [json.loads(line[6:])["text"] for line in rest if line.startswith("data: {")]
    assert "".join(texts).endswith(words) and "data: [DONE]" in rest
    assert max(took) < 5  # seconds: answered, not queued behind the stalled stream


def test_a_body_over_the_limit_is_refused_even_without_content_length(gateway):
    def body():
        yield b'{"messages": "'
        for _ in range(20):
            yield b"x" * (64 << 10)  # 1.25 MiB in all, sent chunked

    response = gateway.post(
        "/v1/apps/answer/invoke", content=body(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "request body is larger than the limit of 1048576 bytes"
    assert gateway.post("/v1/apps/answer/invoke", json=chat_body("small")).status_code == 200


def test_chat_body_over_the_limit_is_413(chat):
    huge = "word " * (1 << 18)  # 1.25 MiB of text
    with pytest.raises(openai.APIStatusError, match="larger than the limit") as error:
        chat.chat.completions.create(model="answer", messages=[{"role": "user", "content": huge}])
    assert error.value.status_code == 413


def test_responses_carry_the_request_id(gateway):
    given = gateway.post(
        "/v1/apps/answer/invoke", json=chat_body("hi"), headers={"x-request-id": "trace-me-42"}
    )
    assert given.headers["x-request-id"] == "trace-me-42"
    fresh = gateway.post(
        "/v1/apps/answer/invoke", json=chat_body("hi"), headers={"x-request-id": "bad id; <script>"}
    )
    assert len(fresh.headers["x-request-id"]) == 32 and fresh.headers["x-request-id"].isalnum()


def test_unknown_routes_and_methods_are_errors_as_data(gateway):
    missing = gateway.get("/v1/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "Not Found"
    wrong = gateway.get("/v1/apps/answer/invoke")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.reliability
def test_a_client_that_leaves_mid_stream_cancels_its_request(serve_gateway):
    async def stalling_llm(task, request):
        yield "first"
        if "stall" in request.prompt:
            await asyncio.Event().wait()  # never set: the stream stalls after one token

    app = create_gateway(LocalRuntime({**EXECUTORS, "llm": stalling_llm}), admin_token=TOKEN)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert (
            client.post("/admin/apps", json={"name": "omni", "source": OMNI}, headers=ADMIN).status_code
            == 201
        )
        with client.stream("POST", "/v1/apps/omni/invoke", json=chat_body("stall")) as response:
            first = next(response.iter_lines())
            assert json.loads(first[6:])["text"] == "first"
        # Leaving cancels the request's serve(); how far cancellation reaches into executors is the runtime's part.
        deadline = time.monotonic() + 10
        counted = 'prismserve_requests_total{app="omni",request_type="text",status="cancelled"} 1.0'
        while counted not in client.get("/metrics").text:
            assert time.monotonic() < deadline, "the request was not counted as cancelled"
            time.sleep(0.02)
        assert client.post("/v1/apps/omni/invoke", json=chat_body("next")).text.endswith("data: [DONE]\n\n")
