"""App sources registered through the admin API in the gateway tests."""

from pathlib import Path

from prismserve.toy.demo import APP_PATH

OMNI = Path(APP_PATH).read_text()

ANSWER = """
from prismserve.app import AppConfig
from prismserve.app.chat import ChatCompletion, ChatRequest
from prismserve.toy.tasks import MLLMTask

mllm = MLLMTask(model_id="m")

class Config(AppConfig):
    tasks = {"mllm": mllm}
    input_modalities = frozenset({"text", "image"})

async def serve(request: ChatRequest) -> ChatCompletion:
    tokens = await (await mllm(request)).text.collect()
    return ChatCompletion(text=" ".join(tokens))
"""

NOT_CHAT = """
from pydantic import BaseModel
from prismserve.app import AppConfig
from prismserve.toy.tasks import EncoderTask, MediaInput

encoder = EncoderTask(model_id="m", modality="image")

class Config(AppConfig):
    tasks = {"encoder": encoder}

class Embed(BaseModel):
    data: str

class Embedding(BaseModel):
    values: list[float]

async def serve(request: Embed) -> Embedding:
    output = await encoder(MediaInput(modality="image", data=request.data.encode()))
    return Embedding(values=output.embedding.value)
"""
