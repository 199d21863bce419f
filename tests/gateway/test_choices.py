"""`n` choices of a chat completion: each its own serve(), interleaved in a stream as they come, and
a failure of any choice handled as one of a single answer (a status before the first chunk, an
error event after it), closing the others."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from gateway_apps import ADMIN, TOKEN, sse_events
from toy.executors import EXECUTORS

from prismserve.gateway import create_gateway
from prismserve.runtime import LocalRuntime

SAMPLER = """
import asyncio
import os
from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from toy.tasks import MLLMTask

class Config(AppConfig):
    tasks = {"mllm": MLLMTask(model_id="m")}  # declared (an app needs one), never called

async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    # The user's text is a script per seed: "7:a,b 8:/gate,c" says seed 7 answers a then b, seed 8
    # waits for the file /gate then answers c; "fail" fails there.
    script = dict(part.split(":") for part in request.messages[-1].text.split())
    for word in script[str(request.seed)].split(","):
        if word.startswith("/"):
            while not os.path.exists(word):
                await asyncio.sleep(0.01)
        elif word == "fail":
            raise RuntimeError("this choice broke")
        else:
            yield ChatChunk(text=word, tokens=1, prompt_tokens=4)
"""
"""Answers per seed as the user's message scripts it, waiting on files where it says so."""


@pytest.fixture
def served(serve_gateway):
    app = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/admin/apps", json={"name": "sampler", "source": SAMPLER}, headers=ADMIN).is_success
        yield http, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def ask(client, script: str, **options):
    messages = [{"role": "user", "content": script}]
    return client.chat.completions.create(model="sampler", messages=messages, seed=7, **options)


def test_each_choice_is_served_with_its_own_seed_and_the_usage_adds_their_tokens(served):
    _, client = served
    answer = ask(client, "7:a,b 8:c 9:d,e,f", n=3)
    assert [(c.index, c.message.content, c.finish_reason) for c in answer.choices] == [
        (0, "ab", "stop"),
        (1, "c", "stop"),
        (2, "def", "stop"),
    ]
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (
        4,
        6,
        10,
    )


def test_streamed_choices_interleave_as_they_come(served, tmp_path):
    """Choice 0 waits for a file that only choice 1's delta lets the test create: the stream must
    carry choice 1's delta while choice 0 is still open."""
    http, _ = served
    gate = tmp_path / "gate"
    body = {
        "model": "sampler",
        "messages": [{"role": "user", "content": f"7:a,{gate},b 8:c"}],
        "seed": 7,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    seen = []
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            seen.append(data)
            if data != "[DONE]" and any(
                c["index"] == 1 and c["delta"].get("content") == "c" for c in json.loads(data)["choices"]
            ):
                gate.touch()
    assert seen[-1] == "[DONE]"
    chunks = [json.loads(data) for data in seen[:-1]]
    texts = {
        i: "".join(
            c["choices"][0]["delta"].get("content") or ""
            for c in chunks
            if c["choices"] and c["choices"][0]["index"] == i
        )
        for i in (0, 1)
    }
    assert texts == {0: "ab", 1: "c"}
    roles = [
        c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("role")
    ]
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert roles == [0, 1] and finishes == [1, 0]  # choice 1 ended first
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_a_failing_choice_fails_the_answer_as_a_single_answer_would_and_the_server_goes_on(served):
    http, client = served
    # Before any choice's first chunk: a status code, for the whole request.
    with pytest.raises(openai.InternalServerError):
        ask(client, "7:a 8:fail", n=2)
    with pytest.raises(openai.InternalServerError):
        ask(client, "7:a 8:fail", n=2, stream=True)
    # After the first chunks: the stream ends with an error event, and no [DONE].
    body = {
        "model": "sampler",
        "messages": [{"role": "user", "content": "7:a,b 8:c,fail"}],
        "seed": 7,
        "n": 2,
    }
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        events = sse_events(response.iter_lines())
    assert response.status_code == 200 and events[-1][0] == "error"
    assert "[DONE]" not in [data for _, data in events]
    assert ask(client, "7:a 8:b", n=2).choices[1].message.content == "b"


def test_n_beyond_the_limit_is_a_400_naming_it(served):
    _, client = served
    with pytest.raises(openai.BadRequestError, match="n"):
        ask(client, "7:a", n=129)
