"""A real (tiny) Qwen2.5-VL served over Ray: encoder and LLM replicas, driven by the `openai` client."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path

import httpx
import openai
import pytest
from PIL import Image
from runtime_apps import started_with_gateway

from prismserve.app.chat import ChatRequest
from prismserve.bench.workloads import workloads_dir
from prismserve.executors.loading import InProcessExecutors
from prismserve.gateway import create_gateway
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.task import LocalDispatcher, use_dispatcher
from prismserve.tasklib import EncoderTask, LLMTask, MLLMTask

TOKEN = "models-on-ray"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen2_5_vl.py"


@pytest.fixture(scope="module")
def tiny_vl() -> str:
    from prismserve.testing import tiny

    return str(tiny.build("qwen2.5-vl"))


@pytest.fixture(scope="module")
def server(ray_cluster, serve_gateway, tiny_vl):
    runtime = RayRuntime()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PRISMSERVE_MODEL", tiny_vl)  # read by the example app when it is registered
        with serve_gateway(create_gateway(runtime, admin_token=TOKEN, lifespan=started_with_gateway(runtime))) as url:
            with httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {TOKEN}"}) as admin:
                registered = admin.post("/admin/apps", json={"name": "vl", "source": EXAMPLE.read_text()})
                assert registered.status_code == 201, registered.text
                yield url, admin
                admin.delete("/admin/apps/vl")


def monolith_text(model: str, request: ChatRequest) -> str:
    async def go() -> str:
        executors = InProcessExecutors()
        with use_dispatcher(LocalDispatcher(executors.callables({EncoderTask, LLMTask}))):
            return "".join(await (await MLLMTask(model=model, encoder_fission=False)(request)).text.collect())

    return asyncio.run(go())


def test_image_and_text_to_text_equals_the_monolith(server, tiny_vl):
    url, admin = server
    jpg = (workloads_dir() / "media" / "cars.jpg").read_bytes()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    image = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpg).decode()}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "What is in the picture?"}]}]
    completion = client.chat.completions.create(model="vl", messages=messages, max_tokens=12)
    expected = monolith_text(tiny_vl, ChatRequest.of("", max_tokens=12).model_copy(
        update={"messages": ChatRequest.model_validate({"messages": [{"role": "user", "content": [
            {"type": "image", "data": base64.b64encode(jpg).decode(), "mime_type": "image/jpeg"},
            {"type": "text", "text": "What is in the picture?"},
        ]}]}).messages}
    ))
    assert completion.choices[0].message.content == expected and expected
    # The encoder and the LLM ran on their own replicas, with the real executors.
    deployments = admin.get("/admin/status").json()["deployments"]
    assert sorted(d["executor_kind"] for d in deployments.values()) == ["mm-encoder", "mm-llm"]
    assert all(len(d["replicas"]) == 1 and d["replicas"][0]["healthy"] for d in deployments.values())


def test_undecodable_image_is_a_400_and_serving_goes_on(server):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    broken = base64.b64encode(b"\x89PNG broken").decode()
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + broken}}
    with pytest.raises(openai.BadRequestError, match="could not be decoded"):  # the gateway's own check
        client.chat.completions.create(model="vl", messages=[{"role": "user", "content": [part]}], max_tokens=4)
    # An image that decodes but that the vision tower cannot take: the encoder replica rejects it.
    sliver = io.BytesIO()
    Image.new("RGB", (1200, 4)).save(sliver, format="PNG")
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(sliver.getvalue()).decode()}}
    with pytest.raises(openai.BadRequestError, match="image cannot be processed: .*aspect ratio"):
        client.chat.completions.create(model="vl", messages=[{"role": "user", "content": [part]}], max_tokens=4)
    stream = client.chat.completions.create(model="vl", messages=[{"role": "user", "content": "hello"}], max_tokens=4, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream)
