"""App sources used by the runtime tests, and the shape of the test cluster."""

import asyncio
import io
import time

from PIL import Image
from ray_session import GPUS_PER_NODE  # noqa: F401  (the runtime tests import it from here)

from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.ray_runtime import RayRuntime

# The deployments of SIM_MLLM, as plans name them.
ENCODER, LLM = "model.encoders.image", "model.llm"

SIM_MLLM = '''
from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.task import Task
from prismserve.tasklib import chat_chunks
from prismserve.tasklib.mllm import TextOutput, llm_input
from prismserve.tasklib.units import EncoderTask, LLMTask


class SimEncoder(EncoderTask):
    executor_kind = "sim"
    executor_ref = None


class SimLLM(LLMTask):
    executor_kind = "sim"
    executor_ref = None


class MLLM(Task[ChatRequest, TextOutput]):
    """MLLMTask's composition (an encoder call per image, then the LLM) on sim-only unit tasks."""

    def post_init(self):
        self.encoders = {{"image": SimEncoder(model="toy-vl", modality="image")}}
        self.llm = SimLLM(model="toy-vl")

    def invoke(self, request):
        return TextOutput(text=self.llm.invoke(llm_input(request, "toy-vl", ("image",), self.encoders)))


model = MLLM()


class Config(AppConfig):
    tasks = {{"model": model}}
    input_modalities = frozenset({{"text", "image"}})
{config}

async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await model(request)):
        yield chunk
'''


def png(width: int, height: int) -> bytes:
    """A solid image of `width` x `height` px (only its header matters to the token count)."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 200)).save(out, format="PNG")
    return out.getvalue()


def plan(encoders: int, llms: int, encoder: dict, llm: dict) -> Plan:
    return Plan.model_validate(
        {
            "cells": [
                {"gpus": 1, "count": encoders, "replicas": {ENCODER: 1}},
                {"gpus": 1, "count": llms, "replicas": {LLM: 1}},
            ],
            "profiles": {ENCODER: encoder, LLM: llm},
        }
    )


async def first_token_s(runtime: RayRuntime, app, request: ChatRequest) -> float:
    """Seconds from sending `request` to its first streamed token (the whole answer is read)."""
    start = time.perf_counter()
    first = None
    async with runtime.request(app.name, request.request_type):
        async for _ in await app.serve(request):
            first = first or time.perf_counter()
    assert first is not None
    return first - start


def serving(config: str, deployed: Plan, scenario):
    """Run `scenario(runtime, app)` with `SIM_MLLM` (its Config body `config`) on the plan `deployed`,
    on the in-process control plane with 16 declared GPUs."""

    async def main():
        runtime = RayRuntime(pool=InProcessPool({"node": 16}))
        await runtime.start()
        try:
            app = await runtime.register_app(SIM_MLLM.format(config=config), "vl")
            await runtime.deploy("vl", deployed)
            return await asyncio.wait_for(scenario(runtime, app), 60)
        finally:
            await runtime.close()

    return asyncio.run(main())


ROUTED_MLLM = """
from pydantic import BaseModel
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import Router
from toy.tasks import MLLMTask

router = Router(paths={
    "EL": MLLMTask(model_id="vl", encoder_fission=False),
    "E->L": MLLMTask(model_id="vl", encoder_fission=True),
})

class Config(AppConfig):
    tasks = {"router": router}
    input_modalities = frozenset({"text", "image"})

class Answer(BaseModel):
    tokens: list[str]

async def serve(request: ChatRequest) -> Answer:
    return Answer(tokens=await (await router(request)).text.collect())
"""

ARENA = """
import asyncio
from pydantic import BaseModel
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from toy.tasks import MLLMTask

models = ["gemma-4b", "gemma-12b"]
mllms = {m: MLLMTask(model_id=m, encoder_model_id="siglip") for m in models}

class Config(AppConfig):
    tasks = mllms
    input_modalities = frozenset({"text", "image"})

class Answers(BaseModel):
    answers: dict[str, list[str]]

async def serve(request: ChatRequest) -> Answers:
    responses = await asyncio.gather(*(task(request) for task in mllms.values()))
    return Answers(answers={m: await r.text.collect() for m, r in zip(models, responses)})
"""

SOLO = """
from pydantic import BaseModel
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from toy.tasks import MLLMTask

mllm = MLLMTask(model_id="gemma-4b", encoder_model_id="siglip")

class Config(AppConfig):
    tasks = {"mllm": mllm}
    input_modalities = frozenset({"text", "image"})

class Answer(BaseModel):
    tokens: list[str]

async def serve(request: ChatRequest) -> Answer:
    return Answer(tokens=await (await mllm(request)).text.collect())
"""


def started_with_gateway(runtime):
    """A gateway lifespan that starts `runtime` before serving and closes it after."""
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(_):
        await runtime.start()
        yield
        await runtime.close()

    return lifespan


# Encoders and an LLM sharing one GPU (shares 0.3 + 0.2 + 0.5), beside a monolith on a GPU of its own.
SHARED_GPU = """
from pydantic import BaseModel
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from prismserve.task import Task
from toy.tasks import ChatOutput, EncoderTask, LLMInput, LLMTask, MediaInput


class Shared(Task[ChatRequest, ChatOutput]):
    def post_init(self):
        self.encoders = {
            "image": EncoderTask(model_id="vl", modality="image", gpus=0.3),
            "audio": EncoderTask(model_id="vl", modality="audio", gpus=0.2),
        }
        self.llm = LLMTask(model_id="vl", gpus=0.5)
        self.whole = LLMTask(model_id="vl", with_encoders=True)

    def invoke(self, request):
        media = [MediaInput(modality="image", data=p.data) for p in request.images]
        embeddings = [self.encoders["image"].invoke(m).embedding for m in media]
        split = self.llm.invoke(LLMInput(prompt=request.prompt, embeddings=embeddings))
        whole = self.whole.invoke(LLMInput(prompt=request.prompt, media=media))
        return ChatOutput(text=split, audio=whole)


shared = Shared()

class Config(AppConfig):
    tasks = {"shared": shared}
    input_modalities = frozenset({"text", "image"})

class Answer(BaseModel):
    split: list[str]
    whole: list[str]

async def serve(request: ChatRequest) -> Answer:
    out = await shared(request)
    return Answer(split=await out.text.collect(), whole=await out.audio.collect())
"""
