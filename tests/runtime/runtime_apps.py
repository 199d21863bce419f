"""App sources used by the runtime tests, and the shape of the test cluster."""

GPUS_PER_NODE = 4

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
