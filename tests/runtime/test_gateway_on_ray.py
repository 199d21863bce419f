"""The whole server: gateway + Ray runtime on declared GPUs, driven by the `openai` client."""

from __future__ import annotations

import base64
import io
import wave
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from PIL import Image
from runtime_apps import started_with_gateway
from toy import APP_PATH
from toy.executors import VALUES

from prismserve.gateway import create_gateway
from prismserve.runtime.ray_runtime import RayRuntime

TOKEN = "ray-test-token"

ROUTED_CHAT = """
from collections.abc import AsyncIterator
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import Router
from toy.tasks import MLLMTask

router = Router(paths={
    "EL": MLLMTask(model_id="vl", encoder_fission=False),
    "E->L": MLLMTask(model_id="vl", encoder_fission=True),
})

class Config(AppConfig):
    tasks = {"router": router}
    input_modalities = frozenset({"text", "image"})

async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    separator = ""
    async for token in (await router(request)).text:
        yield ChatChunk(text=separator + token)
        separator = " "
"""

PLAN = {
    "cells": [
        {
            "gpus": 2,
            "count": 1,
            "replicas": {"router.paths.EL.llm": 1, "router.paths.E->L.encoders.image": 1},
        },
        {"gpus": 1, "count": 1, "replicas": {"router.paths.E->L.llm": 1}},
    ],
    "routing": {"text": {"EL": 0.5, "E->L": 0.5}, "image+text": {"EL": 0.0, "E->L": 1.0}},
}


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (seed, 10, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def server(ray_cluster, serve_gateway, span_exporter):
    """A gateway on the Ray runtime serving vl (planned) and omni, for the module's tests."""
    runtime = RayRuntime(values=VALUES)
    with (
        serve_gateway(
            create_gateway(runtime, admin_token=TOKEN, lifespan=started_with_gateway(runtime))
        ) as url,
        httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {TOKEN}"}) as admin,
    ):
        # 8 declared GPUs: vl's plan takes 3, omni's five single-replica cells the rest.
        assert admin.post("/admin/apps", json={"name": "vl", "source": ROUTED_CHAT}).status_code == 201
        assert admin.post("/admin/apps/vl/plan", json=PLAN).status_code == 200
        omni = admin.post("/admin/apps", json={"name": "omni", "source": APP_PATH.read_text()})
        assert omni.status_code == 201, omni.text
        yield url, admin, runtime


def test_openai_clients_concurrently_over_ray(server):
    url, admin, runtime = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def ask(i: int) -> tuple[int, str]:
        content: list[dict] = [{"type": "text", "text": f"question {i}"}]
        if i % 2:
            content.append(
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64," + base64.b64encode(png(i)).decode()},
                }
            )
        completion = client.chat.completions.create(
            model="vl", messages=[{"role": "user", "content": content}]
        )
        return i, completion.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        answers = dict(pool.map(ask, range(24)))
    for i, text in answers.items():
        assert text.startswith(f"[{i % 2} media, ") and text.endswith(f"user: question {i}")
    # Image requests were all planned onto the fissioned path: the encoder deployment served them.
    status = admin.get("/admin/status").json()
    assert status["policy"] == "static" and len(status["cells"]) >= 2

    stream = client.chat.completions.create(
        model="vl", messages=[{"role": "user", "content": "streamed answer"}], stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream) == "[0 media, 0.000] user: streamed answer"
    )


def test_text_and_audio_out_over_ray(server):
    url, _, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    completion = client.chat.completions.create(
        model="omni", modalities=["text", "audio"], messages=[{"role": "user", "content": "speak up"}]
    )
    message = completion.choices[0].message
    assert message.content == "[0 media, 0.000] user: speak up"
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as clip:
        assert clip.getnframes() == 2 * 4  # 2 samples per token, 4 tokens


def test_admin_api_over_ray_needs_the_token(server):
    url, _, _ = server
    assert httpx.get(f"{url}/admin/status").status_code == 401
    assert httpx.post(f"{url}/admin/apps", json={"name": "x", "source": "x"}).status_code == 401


def test_one_trace_spans_gateway_and_dispatcher(server, span_exporter):
    url, _, _ = server
    span_exporter.clear()
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "traced"}]}]}
    with httpx.stream("POST", f"{url}/v1/apps/vl/invoke", json=body, timeout=60) as response:
        assert response.status_code == 200
        list(response.iter_lines())
    spans = span_exporter.get_finished_spans()
    request = next(s for s in spans if s.name == "prismserve.request")
    dispatch = next(s for s in spans if s.name == "dispatch")
    assert (
        request.attributes["prismserve.app"] == "vl"
        and request.attributes["prismserve.request_type"] == "text"
    )
    assert dispatch.context.trace_id == request.context.trace_id
    assert dispatch.parent.span_id == request.context.span_id
