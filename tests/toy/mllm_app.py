"""Toy app: a multimodal LLM (image encoder fissioned from the LLM) answering with its tokens."""

from pydantic import BaseModel

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from toy.executors import VALUES
from toy.tasks import MLLMTask

mllm = MLLMTask(model_id="toy-vl")


class Config(AppConfig):
    tasks = {"mllm": mllm}
    input_modalities = frozenset({"text", "image"})
    sim_values = VALUES


class Answer(BaseModel):
    """The LLM's tokens."""

    tokens: list[str]


async def serve(request: ChatRequest) -> Answer:
    return Answer(tokens=await (await mllm(request)).text.collect())
