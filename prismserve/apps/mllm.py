"""The chat app of a multimodal LLM: one `MLLMTask`, each media modality's encoder fissioned from the
LLM, streaming text over `/v1/chat/completions` (Qwen2.5-VL's, InternVL3's and Gemma 3's default app).

`prismserve serve MODEL` serves this module with `SETTINGS` written for the checkpoint and the engine
flags; `prismserve serve MODEL --write-app app.py` writes that copy, to edit and serve as an app file.
"""

from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.apps.settings import MLLMAppSettings
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import MediaTokens, MLLMTask, chat_chunks

# The app's parameters, in one statement (`prismserve serve MODEL` writes it for the checkpoint and flags).
SETTINGS = MLLMAppSettings(
    model="Qwen/Qwen2.5-VL-7B-Instruct",
    modalities=("image", "video"),
)

MODEL = SETTINGS.model
model = MLLMTask(
    model=MODEL,
    modalities=SETTINGS.modalities,
    encoder_fission=True,
    engine=SETTINGS.engine,
    prefill_decode=SETTINGS.prefill_decode,
    vllm=SETTINGS.vllm,
    dtype=SETTINGS.dtype,
    gpus=SETTINGS.gpus,
    media_tokens=MediaTokens(image=SETTINGS.image_tokens),
    encoder_cache_mib=SETTINGS.encoder_cache_mib,
)


class Config(AppConfig):
    tasks = {"model": model}
    input_modalities = frozenset({"text", *SETTINGS.modalities})
    output_modalities = frozenset({"text"})


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await model(request)):
        yield chunk
