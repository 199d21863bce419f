"""Qwen2.5-VL with its vision encoder (images and video clips) fissioned from the LLM, streaming text
(OpenAI chat API).

To serve the model as it is, no app file is needed: `prismserve serve Qwen/Qwen2.5-VL-7B-Instruct` (or a checkpoint
directory) builds this same composition. This file is a starting point for other compositions.

MODEL: a checkpoint directory or hub id, from $PRISMSERVE_MODEL (a tiny one: `prismserve tiny
qwen2.5-vl` prints its path). $PRISMSERVE_MONOLITH=1 serves the whole model in one deployment.
$PRISMSERVE_ENGINE=vllm runs the LLM on vLLM (its environment: `prismserve vllm-env`) instead of
transformers, in $PRISMSERVE_VLLM_DTYPE (default: the checkpoint's); with $PRISMSERVE_PREFILL_DECODE=1
on two vLLM deployments, prefill and decode, the KV cache handed over by vLLM's KV connector.
"""

import os
from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import MLLMTask, chat_chunks

MODEL = os.environ.get("PRISMSERVE_MODEL", "Qwen/Qwen2.5-VL-7B-Instruct")
vl = MLLMTask(
    model=MODEL,
    modalities=("image", "video"),
    encoder_fission=os.environ.get("PRISMSERVE_MONOLITH") != "1",
    engine=os.environ.get("PRISMSERVE_ENGINE", "transformers"),
    prefill_decode=os.environ.get("PRISMSERVE_PREFILL_DECODE") == "1",
    vllm={"dtype": os.environ.get("PRISMSERVE_VLLM_DTYPE", "auto")},
)


class Config(AppConfig):
    tasks = {"vl": vl}
    input_modalities = frozenset({"text", "image", "video"})


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await vl(request)):
        yield chunk
