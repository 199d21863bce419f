"""InternVL3 with its vision encoder (InternViT + projector) fissioned from the LLM, streaming text.

To serve the model as it is, no app file is needed: `prismserve serve OpenGVLab/InternVL3-8B-hf` (or a checkpoint
directory) builds this same composition. This file is a starting point for other compositions.

MODEL: a transformers-format (`-hf`) checkpoint directory or hub id, from $PRISMSERVE_MODEL (a tiny
one: `prismserve tiny internvl3` prints its path). $PRISMSERVE_MONOLITH=1 serves the whole model in
one deployment. $PRISMSERVE_ENGINE=vllm runs the LLM on vLLM (its environment: `prismserve vllm-env`)
instead of transformers, in $PRISMSERVE_VLLM_DTYPE (default: the checkpoint's).
"""

import os
from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import MLLMTask, chat_chunks

MODEL = os.environ.get("PRISMSERVE_MODEL", "OpenGVLab/InternVL3-8B-hf")
vl = MLLMTask(
    model=MODEL,
    encoder_fission=os.environ.get("PRISMSERVE_MONOLITH") != "1",
    engine=os.environ.get("PRISMSERVE_ENGINE", "transformers"),
    vllm={"dtype": os.environ.get("PRISMSERVE_VLLM_DTYPE", "auto")},
    # Token-aware routing counts 256 tokens per 448-px tile, as InternVL's processor cuts images.
    media_tokens={"image": "tiles"},
)


class Config(AppConfig):
    tasks = {"vl": vl}
    input_modalities = frozenset({"text", "image"})


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await vl(request)):
        yield chunk
