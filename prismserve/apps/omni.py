"""The chat app of an Omni model: one `OmniTask` with its image and audio encoders, thinker, talker and
vocoder as separate deployments (or, with `monolith`, the whole model in one), text and speech out
over `/v1/chat/completions` (Qwen2.5-Omni's and Qwen3-Omni's default app, and the demo's).

`prismserve serve MODEL` serves this module with `SETTINGS` written for the checkpoint and the engine
flags; `prismserve serve MODEL --write-app app.py` writes that copy, to edit and serve as an app file.
"""

from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.apps.settings import OmniAppSettings
from prismserve.models import voices as checkpoint_voices
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import OmniTask, chat_chunks

# The app's parameters, in one statement (`prismserve serve MODEL` writes it for the checkpoint and flags).
SETTINGS = OmniAppSettings(
    model="Qwen/Qwen2.5-Omni-7B",
)

MODEL = SETTINGS.model
model = OmniTask(
    model=MODEL,
    modalities=SETTINGS.modalities,
    encoder_fission=True,
    monolith=SETTINGS.monolith,
    max_codes=SETTINGS.max_codes,
    engine=SETTINGS.engine,
    prefill_decode=SETTINGS.prefill_decode,
    vllm=SETTINGS.vllm,
    dtype=SETTINGS.dtype,
    gpus=SETTINGS.gpus,
    encoder_cache_mib=SETTINGS.encoder_cache_mib,
)


def voices() -> tuple[str, ...]:
    """The checkpoint's speakers, its default first (`GET /v1/audio/voices`)."""
    return checkpoint_voices(MODEL)


class Config(AppConfig):
    tasks = {"model": model}
    input_modalities = frozenset({"text", *SETTINGS.modalities})
    output_modalities = frozenset({"text", "audio"})
    voices = voices  # a plain function: read on the class, it is not bound to it


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await model(request)):
        yield chunk
