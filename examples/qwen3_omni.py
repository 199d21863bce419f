"""Qwen3-Omni (MoE thinker): image and audio encoders, thinker, talker (with its code predictor) and
code2wav as separate deployments; text and speech out (OpenAI chat API: `modalities: ["text", "audio"]`).

To serve the model as it is, no app file is needed: `prismserve serve Qwen/Qwen3-Omni-30B-A3B-Instruct` (or a checkpoint
directory) builds this same composition. This file is a starting point for other compositions.

MODEL: a checkpoint directory or hub id, from $PRISMSERVE_MODEL (a tiny one: `prismserve tiny
qwen3-omni` prints its path). $PRISMSERVE_MONOLITH=1 serves the whole model in one deployment,
run by transformers' own `generate` (the paper's baseline). $PRISMSERVE_ENGINE=vllm runs the thinker
on vLLM (its environment: `prismserve vllm-env`; audio then goes to the thinker raw, which keeps the
audio tower) in $PRISMSERVE_VLLM_DTYPE (default: the checkpoint's).
"""

import os
from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import OmniTask, chat_chunks

MODEL = os.environ.get("PRISMSERVE_MODEL", "Qwen/Qwen3-Omni-30B-A3B-Instruct")
omni = OmniTask(
    model=MODEL,
    monolith=os.environ.get("PRISMSERVE_MONOLITH") == "1",
    engine=os.environ.get("PRISMSERVE_ENGINE", "transformers"),
    vllm={"dtype": os.environ.get("PRISMSERVE_VLLM_DTYPE", "auto")},
)


class Config(AppConfig):
    tasks = {"omni": omni}
    input_modalities = frozenset({"text", "image", "audio"})
    output_modalities = frozenset({"text", "audio"})


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await omni(request)):
        yield chunk
