"""A real (tiny) Qwen2.5-VL served over Ray: encoder and LLM replicas, driven by the `openai` client."""

from __future__ import annotations

import asyncio
import base64
import io
import wave
from pathlib import Path

import httpx
import numpy as np
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
from prismserve.tasklib import EncoderTask, LLMTask, MLLMTask, OmniTask
from prismserve.tasklib.units import OmniMonolithTask

TOKEN = "models-on-ray"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def tiny_vl() -> str:
    from prismserve.testing import tiny

    return str(tiny.build("qwen2.5-vl"))


@pytest.fixture(scope="module")
def tiny_omni() -> str:
    from prismserve.testing import tiny

    return str(tiny.build("qwen2.5-omni"))


@pytest.fixture(scope="module")
def server(ray_cluster, serve_gateway, tiny_vl, tiny_omni):
    """The two example apps on one gateway: Qwen2.5-VL (2 replicas) and Qwen2.5-Omni (5)."""
    runtime = RayRuntime()
    with serve_gateway(create_gateway(runtime, admin_token=TOKEN, lifespan=started_with_gateway(runtime))) as url:
        with httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {TOKEN}"}) as admin:
            for name, model in (("vl", tiny_vl), ("omni", tiny_omni)):
                with pytest.MonkeyPatch.context() as env:
                    env.setenv("PRISMSERVE_MODEL", model)  # read by the example app when it is registered
                    source = (EXAMPLES / f"qwen2_5_{name}.py").read_text()
                    registered = admin.post("/admin/apps", json={"name": name, "source": source})
                assert registered.status_code == 201, registered.text
            yield url, admin
            for name in ("vl", "omni"):
                admin.delete(f"/admin/apps/{name}")


def chat_request(content: list[dict], **fields) -> ChatRequest:
    """A one-message user request whose parts are in the given order."""
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": content}], **fields})


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
    image_part = {"type": "image", "data": base64.b64encode(jpg).decode(), "mime_type": "image/jpeg"}
    request = chat_request([image_part, {"type": "text", "text": "What is in the picture?"}], max_tokens=12)
    expected = monolith_text(tiny_vl, request)
    assert completion.choices[0].message.content == expected and expected
    # The encoder and the LLM ran on their own replicas, with the real executors.
    deployments = admin.get("/admin/status").json()["deployments"]
    vl = [d for d in deployments.values() if "vl" in d["apps"]]
    assert sorted(d["executor_kind"] for d in vl) == ["mm-encoder", "mm-llm"]
    assert all(len(d["replicas"]) == 1 and d["replicas"][0]["healthy"] for d in vl)


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


def test_audio_and_text_to_text_and_speech_equals_the_monolith(server, tiny_omni):
    url, admin = server
    wav = (workloads_dir() / "media" / "query_to_cars.wav").read_bytes()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    spoken = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    completion = client.chat.completions.create(
        model="omni", modalities=["text", "audio"], max_tokens=8, seed=5,
        messages=[{"role": "user", "content": [spoken, {"type": "text", "text": "Answer aloud."}]}],
    )  # fmt: skip
    message = completion.choices[0].message
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as clip:
        assert clip.getframerate() == 24000 and clip.getsampwidth() == 2
        pcm = np.frombuffer(clip.readframes(clip.getnframes()), "<i2")
    request = chat_request([{"type": "audio", "data": base64.b64encode(wav).decode()}, {"type": "text", "text": "Answer aloud."}],
                           modalities=["text", "audio"], max_tokens=8, seed=5)  # fmt: skip
    text, audio = omni_monolith(tiny_omni, request)
    assert message.content == text and text
    whole = np.frombuffer(audio, "<i2")
    assert len(pcm) == len(whole) > 0 and np.abs(pcm.astype(int) - whole).max() <= 2
    omni = [d for d in admin.get("/admin/status").json()["deployments"].values() if "omni" in d["apps"]]
    assert sorted(d["executor_kind"] for d in omni) == ["mm-encoder", "mm-encoder", "mm-talker", "mm-thinker", "mm-vocoder"]


def omni_monolith(model: str, request: ChatRequest) -> tuple[str, bytes]:
    """Text and audio of transformers' own end-to-end `generate`, in this process."""

    async def go() -> tuple[str, bytes]:
        executors = InProcessExecutors()
        with use_dispatcher(LocalDispatcher(executors.callables({OmniMonolithTask}))):
            out = await OmniTask(model=model, monolith=True)(request)
            return "".join(await out.text.collect()), b"".join(await out.audio.collect())

    return asyncio.run(go())
