"""Gemma 3 with its vision encoder (SigLIP + pooling projector) fissioned from the LLM, streaming text.

To serve the model as it is, no app file is needed: `prismserve serve google/gemma-3-4b-it` (or a checkpoint
directory) builds this same composition. This file is a starting point for other compositions.

MODEL: a checkpoint directory or hub id, from $PRISMSERVE_MODEL (a tiny
one: `prismserve tiny gemma3` prints its path). $PRISMSERVE_MONOLITH=1 serves the whole model in
one deployment. $PRISMSERVE_ENGINE=vllm runs the LLM on vLLM (its environment: `prismserve vllm-env`)
instead of transformers, in $PRISMSERVE_VLLM_DTYPE (default: the checkpoint's).
"""

import os
from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import MLLMTask, chat_chunks

MODEL = os.environ.get("PRISMSERVE_MODEL", "google/gemma-3-4b-it")
vl = MLLMTask(
    model=MODEL,
    encoder_fission=os.environ.get("PRISMSERVE_MONOLITH") != "1",
    engine=os.environ.get("PRISMSERVE_ENGINE", "transformers"),
    vllm={"dtype": os.environ.get("PRISMSERVE_VLLM_DTYPE", "auto")},
    media_tokens={"image": "fixed"},  # token-aware routing: 256 tokens per image, whatever its size
)


class Config(AppConfig):
    tasks = {"vl": vl}
    input_modalities = frozenset({"text", "image"})


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await vl(request)):
        yield chunk
