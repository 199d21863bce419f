"""Qwen3-Omni (MoE thinker) with its image and audio encoders fissioned from the thinker: image,
audio and text in, text out (speech output is not split yet).

MODEL: a checkpoint directory or hub id, from $PRISMSERVE_MODEL (a tiny one: `prismserve tiny
qwen3-omni` prints its path). $PRISMSERVE_MONOLITH=1 serves encoders and thinker in one deployment.
"""

import os
from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.app.chat import ChatChunk, ChatRequest
from prismserve.tasklib import MLLMTask

MODEL = os.environ.get("PRISMSERVE_MODEL", "Qwen/Qwen3-Omni-30B-A3B-Instruct")
omni = MLLMTask(model=MODEL, modalities=("image", "audio"), encoder_fission=os.environ.get("PRISMSERVE_MONOLITH") != "1")


class Config(AppConfig):
    tasks = {"omni": omni}
    input_modalities = frozenset({"text", "image", "audio"})


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for text in (await omni(request)).text:
        yield ChatChunk(text=text)
