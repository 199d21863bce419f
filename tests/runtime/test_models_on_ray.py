"""Real (tiny) models served over Ray, one replica per component, driven by the `openai` client:
image+text -> text, audio+text -> text+speech, text -> image, each equal to its monolith."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import io
import os
import re
import shutil
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import psutil
import pytest
from openai_checks import check_context, check_sampling, check_structured
from PIL import Image
from runtime_apps import started_with_gateway

from prismserve.bench.payloads import video_url
from prismserve.bench.workloads import workloads_dir
from prismserve.executors import envs
from prismserve.executors.loading import InProcessExecutors
from prismserve.gateway import create_gateway
from prismserve.protocol.chat import ChatRequest
from prismserve.protocol.images import ImageRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.task import use_dispatcher
from prismserve.tasklib import EncoderTask, LLMTask, MLLMTask, OmniTask, reply_text
from prismserve.tasklib.imagegen import ImageGenTask
from prismserve.tasklib.mllm import handoff_dir
from prismserve.tasklib.units import ImageGeneratorTask, OmniMonolithTask

TOKEN = "models-on-ray"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def gateway(ray_cluster, serve_gateway):
    """A gateway on the Ray runtime; each test class registers the example app it serves."""
    runtime = RayRuntime()
    with (
        serve_gateway(
            create_gateway(runtime, admin_token=TOKEN, lifespan=started_with_gateway(runtime))
        ) as url,
        httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {TOKEN}"}) as admin,
    ):
        yield url, admin


@contextlib.contextmanager
def example(
    gateway, family: str, example_file: str, **settings: str
) -> Iterator[tuple[str, httpx.Client, str]]:
    """The example app `example_file` (named after it) on `family`'s tiny checkpoint, unregistered after;
    `settings` are more of the environment variables it reads."""
    from prismserve.models import tiny

    url, admin = gateway
    model = str(tiny.build(family))
    with pytest.MonkeyPatch.context() as env:
        for name, value in {"PRISMSERVE_MODEL": model, **settings}.items():
            env.setenv(name, value)  # read by the example app when it is registered
        name = Path(example_file).stem
        registered = admin.post(
            "/admin/apps", json={"name": name, "source": (EXAMPLES / example_file).read_text()}
        )
    assert registered.status_code == 201, registered.text
    try:
        yield url, admin, model
    finally:
        admin.delete(f"/admin/apps/{name}")


def chat_request(content: list[dict], **fields) -> ChatRequest:
    """A one-message user request whose parts are in the given order."""
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": content}], **fields})


def monolith_text(model: str, request: ChatRequest, modalities: tuple[str, ...] = ("image",)) -> str:
    async def go() -> str:
        executors = InProcessExecutors()
        with use_dispatcher(LocalDispatcher(executors.callables({EncoderTask, LLMTask}))):
            task = MLLMTask(model=model, modalities=modalities, encoder_fission=False)
            return await reply_text((await task(request)).text)

    return asyncio.run(go())


@pytest.fixture(scope="class")
def vl(gateway):
    """Qwen2.5-VL registered for the tests of one class."""
    with example(gateway, "qwen2.5-vl", "qwen2_5_vl.py") as served:
        yield served


class TestQwenVL:
    """Qwen2.5-VL: image encoder and LLM replicas."""

    def test_image_and_text_to_text_equals_the_monolith(self, vl):
        url, admin, tiny_vl = vl
        jpg = (workloads_dir() / "media" / "cars.jpg").read_bytes()
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        image = {
            "type": "image_url",
            "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpg).decode()},
        }
        messages = [{"role": "user", "content": [image, {"type": "text", "text": "What is in the picture?"}]}]
        completion = client.chat.completions.create(model="qwen2_5_vl", messages=messages, max_tokens=12)
        image_part = {"type": "image", "data": base64.b64encode(jpg).decode(), "mime_type": "image/jpeg"}
        request = chat_request(
            [image_part, {"type": "text", "text": "What is in the picture?"}], max_tokens=12
        )
        expected = monolith_text(tiny_vl, request)
        assert completion.choices[0].message.content == expected and expected
        # The encoder and the LLM ran on their own replicas, with the real executors.
        deployments = admin.get("/admin/status").json()["deployments"]
        assert sorted(d["executor_kind"] for d in deployments.values()) == [
            "mm-encoder",
            "mm-encoder",
            "mm-llm",
        ]  # image, video
        assert all(
            len(d["replicas"]) == 1 and d["replicas"][0]["state"] == "running" for d in deployments.values()
        )

    def test_video_clip_and_text_to_text_equals_the_monolith(self, vl):
        url, _, tiny_vl = vl
        clip = video_url(str(workloads_dir()), frames=6)  # an animated GIF panning across cars.jpg
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        content = [
            {"type": "video_url", "video_url": {"url": clip}},
            {"type": "text", "text": "What happens?"},
        ]
        completion = client.chat.completions.create(
            model="qwen2_5_vl", messages=[{"role": "user", "content": content}], max_tokens=8
        )
        video = {"type": "video", "data": clip.split(",", 1)[1], "mime_type": "image/gif"}
        expected = monolith_text(
            tiny_vl,
            chat_request([video, {"type": "text", "text": "What happens?"}], max_tokens=8),
            ("image", "video"),
        )
        assert completion.choices[0].message.content == expected and expected

    def test_undecodable_image_is_a_400_and_serving_goes_on(self, vl):
        url, _, _ = vl
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        broken = base64.b64encode(b"\x89PNG broken").decode()
        part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + broken}}
        with pytest.raises(openai.BadRequestError, match="could not be decoded"):  # the gateway's own check
            client.chat.completions.create(
                model="qwen2_5_vl", messages=[{"role": "user", "content": [part]}], max_tokens=4
            )
        # An image that decodes but that the vision tower cannot take: the encoder replica rejects it.
        sliver = io.BytesIO()
        Image.new("RGB", (1200, 4)).save(sliver, format="PNG")
        part = {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(sliver.getvalue()).decode()},
        }
        with pytest.raises(openai.BadRequestError, match="image cannot be processed: .*aspect ratio"):
            client.chat.completions.create(
                model="qwen2_5_vl", messages=[{"role": "user", "content": [part]}], max_tokens=4
            )
        stream = client.chat.completions.create(
            model="qwen2_5_vl", messages=[{"role": "user", "content": "hello"}], max_tokens=4, stream=True
        )
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream)


OMNI_EXAMPLES = [("qwen2.5-omni", "qwen2_5_omni.py"), ("qwen3-omni", "qwen3_omni.py")]


@pytest.mark.parametrize(("family", "example_file"), OMNI_EXAMPLES)
def test_audio_and_text_to_text_and_speech_equals_the_monolith(gateway, family, example_file):
    with example(gateway, family, example_file) as (url, admin, tiny_omni):
        check_speech(url, admin, tiny_omni, Path(example_file).stem)


def check_speech(
    url: str,
    admin: httpx.Client,
    tiny_omni: str,
    app: str,
    *,
    image: bytes | None = None,
    kinds: tuple[str, ...] = ("mm-encoder", "mm-encoder", "mm-talker", "mm-thinker", "mm-vocoder"),
) -> None:
    """A spoken question (and `image`) answered in text and speech as transformers' monolith answers
    it, by deployments of these executor kinds."""
    wav = (workloads_dir() / "media" / "query_to_cars.wav").read_bytes()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    spoken = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    question = {"type": "text", "text": "Answer aloud."}
    shown = [] if image is None else [
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(image).decode()}}
    ]  # fmt: skip
    completion = client.chat.completions.create(
        model=app, modalities=["text", "audio"], max_tokens=8, seed=5,
        messages=[{"role": "user", "content": [*shown, spoken, question]}],
    )  # fmt: skip
    message = completion.choices[0].message
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as clip:
        assert clip.getframerate() == 24000 and clip.getsampwidth() == 2
        pcm = np.frombuffer(clip.readframes(clip.getnframes()), "<i2")
    parts = (
        [{"type": "image", "data": base64.b64encode(image).decode(), "mime_type": "image/jpeg"}]
        if image
        else []
    )
    parts += [{"type": "audio", "data": base64.b64encode(wav).decode()}, question]
    request = chat_request(parts, modalities=["text", "audio"], max_tokens=8, seed=5)
    text, audio = omni_monolith(tiny_omni, request)
    assert message.content == text and text
    whole = np.frombuffer(audio, "<i2")
    assert len(pcm) == len(whole) > 0 and np.abs(whole).max() > 1000
    # The vocoder streams: Qwen2.5-Omni's token2wav windows reach all the DiT attends to (float noise,
    # then 16-bit rounding); Qwen3-Omni's code2wav decodes 25 frames at a time with 25 of left context
    # where transformers' whole-utterance decode has up to 300 (left-context error, within 1 %).
    tolerance = 2 if "qwen2" in app else 0.01 * np.abs(whole).max()
    assert np.abs(pcm.astype(int) - whole).max() <= tolerance
    omni = [d for d in admin.get("/admin/status").json()["deployments"].values() if app in d["apps"]]
    assert sorted(d["executor_kind"] for d in omni) == sorted(kinds)
    with pytest.raises(openai.BadRequestError, match="has no speaker 'alloy'"):  # the voice is honoured
        client.chat.completions.create(
            model=app, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"},
            messages=[{"role": "user", "content": "Speak."}],
        )  # fmt: skip


def omni_monolith(model: str, request: ChatRequest) -> tuple[str, bytes]:
    """Text and audio of transformers' own end-to-end `generate`, in this process."""

    async def go() -> tuple[str, bytes]:
        executors = InProcessExecutors()
        with use_dispatcher(LocalDispatcher(executors.callables({OmniMonolithTask}))):
            out = await OmniTask(model=model, monolith=True)(request)
            return await reply_text(out.text), b"".join(await out.audio.collect())

    return asyncio.run(go())


def test_text_to_image_over_ray_equals_the_whole_pipeline(gateway):
    with example(gateway, "qwen-image", "qwen_image.py") as (url, admin, model):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        result = client.images.generate(
            model="qwen_image", prompt="cars", size="32x32", extra_body={"seed": 9, "num_inference_steps": 3}
        )
        png = base64.b64decode(result.data[0].b64_json)
        kinds = sorted(d["executor_kind"] for d in admin.get("/admin/status").json()["deployments"].values())
    assert kinds == ["mm-image", "mm-text-encoder"]

    async def whole() -> bytes:
        executors = InProcessExecutors()
        with use_dispatcher(LocalDispatcher(executors.callables({ImageGeneratorTask}))):
            request = ImageRequest(prompt="cars", width=32, height=32, steps=3, seed=9)
            return (
                await (await ImageGenTask(model=model, text_encoder_fission=False)(request)).images[0].fetch()
            )

    assert np.array_equal(
        np.asarray(Image.open(io.BytesIO(png))), np.asarray(Image.open(io.BytesIO(asyncio.run(whole()))))
    )


def ask_about_cars(url: str, app: str, *, stream: bool = False, image: bytes | None = None) -> str:
    """The app's answer to cars.jpg (or `image`) and a question, over the OpenAI API."""
    data = image or (workloads_dir() / "media" / "cars.jpg").read_bytes()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    part = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()},
    }
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "What is in the picture?"}]}]
    answer = client.chat.completions.create(model=app, messages=messages, max_tokens=12, stream=stream)
    if not stream:
        return answer.choices[0].message.content
    deltas = [chunk.choices[0].delta.content or "" for chunk in answer]
    assert sum(map(bool, deltas)) > 1, "the text came in one piece, not streamed"
    return "".join(deltas)


def hf_cars_answer(model: str) -> str:
    """What transformers' whole model (the monolith, in this process) answers to `ask_about_cars`."""
    jpg = (workloads_dir() / "media" / "cars.jpg").read_bytes()
    part = {"type": "image", "data": base64.b64encode(jpg).decode(), "mime_type": "image/jpeg"}
    return monolith_text(
        model, chat_request([part, {"type": "text", "text": "What is in the picture?"}], max_tokens=12)
    )


VLLM = {"PRISMSERVE_ENGINE": "vllm", "PRISMSERVE_VLLM_DTYPE": "float32"}


def taken_handoffs(folder: str) -> list[str]:
    """The prefill → decode hand-offs in `folder` that a decode took."""
    return [name for name in os.listdir(folder) if os.path.exists(os.path.join(folder, name, ".taken"))]


def prompt_tokens(model: str, text: str) -> int:
    """How many tokens an LLM of `model` is fed for one user message `text`."""
    from prismserve.models import adapter_for
    from prismserve.tasklib import conversation

    return adapter_for(model).llm_inputs(conversation(ChatRequest.of(text))[0])["input_ids"].shape[1]


@pytest.mark.vllm
class TestVLLM:
    """Qwen2.5-VL's LLM on vLLM's engine, in the vLLM environment: fissioned (embeddings from the
    transformers encoder deployment) and monolithic (vLLM runs the vision tower on raw images)."""

    def test_fissioned_llm_on_vllm_answers_as_the_transformers_monolith(self, gateway):
        with example(gateway, "qwen2.5-vl", "qwen2_5_vl.py", **VLLM) as (url, admin, model):
            expected = hf_cars_answer(model)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:  # batched in vLLM's engine
                answers = list(
                    pool.map(
                        lambda stream: ask_about_cars(url, "qwen2_5_vl", stream=stream), [True, False] * 2
                    )
                )
            status = admin.get("/admin/status").json()["deployments"]
            assert expected and answers == [expected] * 4
            kinds = {d["executor_kind"]: d["replicas"] for d in status.values()}
            assert sorted(kinds) == ["mm-encoder", "mm-llm-vllm"]
            llm = kinds["mm-llm-vllm"][0]
            assert (
                llm["python"] == envs.runtime_env("vllm")["py_executable"] != kinds["mm-encoder"][0]["python"]
            )
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
            clip = [{"type": "video_url", "video_url": {"url": video_url(str(workloads_dir()), frames=4)}}]
            with pytest.raises(openai.BadRequestError, match="vLLM executors take no video yet"):
                client.chat.completions.create(
                    model="qwen2_5_vl", messages=[{"role": "user", "content": clip}], max_tokens=4
                )
            check_sampling(client, "qwen2_5_vl", prompt_tokens(model, "Tell me a story about a robot."))
            check_structured(client, "qwen2_5_vl")
            check_context(client, "qwen2_5_vl", 4096)  # vLLM's max_model_len here
            # vLLM's engine processes die: the health check restarts the replica, and serving goes on.
            for process in psutil.Process(llm["pid"]).children(recursive=True):
                process.kill()
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                llm = [
                    d
                    for d in admin.get("/admin/status").json()["deployments"].values()
                    if d["executor_kind"] == "mm-llm-vllm"
                ]
                if llm[0]["replicas"][0]["restarts"] == 1 and llm[0]["replicas"][0]["state"] == "running":
                    break
                time.sleep(1)
            assert llm[0]["replicas"][0]["state"] == "running" and llm[0]["replicas"][0]["restarts"] == 1
            assert ask_about_cars(url, "qwen2_5_vl") == expected

    def test_prefill_and_decode_on_two_vllm_engines_answer_as_the_monolith(self, gateway, monkeypatch):
        settings = {**VLLM, "PRISMSERVE_PREFILL_DECODE": "1"}
        with example(gateway, "qwen2.5-vl", "qwen2_5_vl.py", **settings) as (url, admin, model):
            handoffs = handoff_dir(model, {"dtype": "float32"})
            shutil.rmtree(handoffs, ignore_errors=True)  # what an earlier run left
            expected = hf_cars_answer(model)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:  # batched in both engines
                answers = list(
                    pool.map(
                        lambda stream: ask_about_cars(url, "qwen2_5_vl", stream=stream), [True, False] * 2
                    )
                )
            assert expected and answers == [expected] * 4
            kinds = sorted(
                d["executor_kind"] for d in admin.get("/admin/status").json()["deployments"].values()
            )
            assert kinds == ["mm-encoder", "mm-encoder", "mm-llm-decode", "mm-llm-prefill"]  # image, video
            sliver = io.BytesIO()
            Image.new("RGB", (1200, 4)).save(sliver, format="PNG")  # decodes; the encoder cannot take it
            with pytest.raises(openai.BadRequestError):
                ask_about_cars(url, "qwen2_5_vl", image=sliver.getvalue())
            assert ask_about_cars(url, "qwen2_5_vl", stream=True) == expected
            # The hand-offs decode took are swept after the grace period. (Sometimes one is left untaken
            # here, to be swept after the TTL; why is not yet known: the notes.)
            deadline = time.monotonic() + 30
            while taken_handoffs(handoffs) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert taken_handoffs(handoffs) == []
            # TriInfer's ED + P: the encoders and decode share one GPU (shares packed), prefill has its own.
            encoders = {f"vl.encoders.{m}": 0.15 for m in ("image", "video")}
            plan = {
                "options": {"ED": {**encoders, "vl.decode": 0.7}, "P": {"vl.prefill": 1.0}},
                "cells": [{"gpus": 2, "replicas": {"ED": 1, "P": 1}}],
                "routing": {"image+text": {"ED->P": 1.0}, "text": {"ED->P": 1.0}},
            }
            # Four replicas start at once, two of them vLLM engines: on CI's 2 cores one took over the
            # 120 s a tiny checkpoint's replica gets by default (read by the in-process runtime).
            monkeypatch.setenv("PRISMSERVE_START_TIMEOUT_S", "600")
            assert admin.post("/admin/apps/qwen2_5_vl/plan", json=plan).status_code == 200
            assert ask_about_cars(url, "qwen2_5_vl", stream=True) == expected
            gpus: dict[tuple[str, float], set[str]] = {}
            for d in admin.get("/admin/status").json()["deployments"].values():
                for r in d["replicas"]:
                    if r["state"] == "running":
                        gpus.setdefault((d["executor_kind"], r["gpus"]), set()).update(r["gpu_ids"])
            shared = gpus[("mm-encoder", 0.15)] | gpus[("mm-llm-decode", 0.7)]
            assert len(shared) == 1 and gpus[("mm-llm-prefill", 1.0)].isdisjoint(shared)

    def test_monolith_on_vllm_answers_the_same_and_rejects_bad_images(self, gateway):
        settings = {**VLLM, "PRISMSERVE_MONOLITH": "1"}
        with example(gateway, "qwen2.5-vl", "qwen2_5_vl.py", **settings) as (url, admin, model):
            assert ask_about_cars(url, "qwen2_5_vl") == hf_cars_answer(model)
            sliver = io.BytesIO()
            Image.new("RGB", (1200, 4)).save(sliver, format="PNG")  # decodes; vLLM's processor cannot take it
            with pytest.raises(openai.BadRequestError, match="cannot take this input"):
                ask_about_cars(url, "qwen2_5_vl", image=sliver.getvalue())
            assert ask_about_cars(url, "qwen2_5_vl", stream=True) == hf_cars_answer(model)
            replicas = [
                r for d in admin.get("/admin/status").json()["deployments"].values() for r in d["replicas"]
            ]
        assert len(replicas) == 1 and replicas[0]["state"] == "running" and replicas[0]["restarts"] == 0


@pytest.mark.vllm
@pytest.mark.parametrize(("family", "example_file"), OMNI_EXAMPLES)
def test_omni_thinker_on_vllm_speaks_as_the_transformers_monolith(gateway, family, example_file):
    """An Omni model with its thinker on vLLM (vLLM environment): image encoder fissioned, audio raw to
    the thinker, talker and vocoder on transformers; text and speech as transformers' whole model."""
    with example(gateway, family, example_file, **VLLM) as (url, admin, model):
        kinds = ("mm-encoder", "mm-talker", "mm-thinker-vllm", "mm-vocoder")
        jpg = (workloads_dir() / "media" / "cars.jpg").read_bytes()
        app = Path(example_file).stem
        check_speech(url, admin, model, app, image=jpg, kinds=kinds)
        check_speech(url, admin, model, app, kinds=kinds)
        thinker = [d for d in admin.get("/admin/status").json()["deployments"].values()
                   if d["executor_kind"] == "mm-thinker-vllm"][0]["replicas"][0]  # fmt: skip
        assert (
            thinker["python"] == envs.runtime_env("vllm")["py_executable"] and thinker["state"] == "running"
        )


def test_vllm_without_its_environment_is_refused_at_registration(gateway, tmp_path, monkeypatch):
    monkeypatch.delenv("PRISMSERVE_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("PRISMSERVE_VLLM_ENV", str(tmp_path / "none"))
    url, admin = gateway
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PRISMSERVE_ENGINE", "vllm")
        refused = admin.post(
            "/admin/apps", json={"name": "vl_vllm", "source": (EXAMPLES / "qwen2_5_vl.py").read_text()}
        )
    assert refused.status_code == 503 and "prismserve vllm-env" in refused.text
    assert "vl_vllm" not in admin.get("/admin/apps").text


def encoder_app(model: str) -> str:
    """An app of one real image encoder (the tiny Qwen2.5-VL's), answering an image's embedding shape."""
    return f"""
from pydantic import BaseModel
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import EncoderTask
from prismserve.tasklib.units import MediaItem

encoder = EncoderTask(model={model!r}, modality="image")

class Config(AppConfig):
    tasks = {{"encoder": encoder}}
    input_modalities = frozenset({{"text", "image"}})

class Shape(BaseModel):
    shape: list[int]

async def serve(request: ChatRequest) -> Shape:
    out = await encoder(MediaItem(modality="image", data=request.images[0].data))
    return Shape(shape=list((await out.embeddings.fetch()).shape))
"""


def test_a_model_replica_on_a_gpu_without_cuda_fails_registration_unless_told_to_use_the_cpu(ray_cluster):
    import ray

    from prismserve.errors import ReplicaStartError
    from prismserve.models import tiny

    source = encoder_app(str(tiny.build("qwen2.5-vl")))
    png = io.BytesIO()
    Image.new("RGB", (56, 56), (10, 120, 200)).save(png, format="PNG")

    def cell_groups() -> set[str]:
        """The ids of the placement groups of cells that are not removed."""
        table = ray.util.placement_group_table()
        return {
            k
            for k, g in table.items()
            if g["name"].startswith("prismserve-cell-") and g["state"] != "REMOVED"
        }

    async def refused() -> tuple[str, int, int, set[str]]:
        # The test cluster's replicas run with PRISMSERVE_DEVICE=cpu; empty is unset.
        runtime = RayRuntime(replica_env={"PRISMSERVE_DEVICE": ""})
        await runtime.start()
        before = cell_groups()
        try:
            with pytest.raises(ReplicaStartError) as error:
                await runtime.register_app(source, "encoder")
            return str(error.value), len(runtime.resources.cells), len(runtime.managers), before
        finally:
            await runtime.close()

    async def served() -> list[int]:
        runtime = RayRuntime()
        await runtime.start()
        try:
            app = await runtime.register_app(source, "encoder")
            with use_dispatcher(runtime.dispatcher):
                return (await app.serve(ChatRequest.of("", images=[png.getvalue()]))).shape
        finally:
            await runtime.close()

    message, cells, managers, before = asyncio.run(refused())
    assert re.search(
        r"a replica of EncoderTask \(prismserve\.tasklib\.units\.EncoderTask:\w+\) was placed on GPUs \d+ "
        r"but torch \S+ \(a CPU build\) sees no CUDA device: install a CUDA build of torch, or serve with "
        r"--fake-gpus / set PRISMSERVE_DEVICE=cpu",
        message,
    ), message
    assert cells == managers == 0
    assert not cell_groups() - before  # the registration's cell was given back: nothing of it left
    assert len(asyncio.run(served())) == 2  # [tokens, hidden]: the same replica serves on the CPU
