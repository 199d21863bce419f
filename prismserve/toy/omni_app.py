"""Demo app: a toy Omni model (encoders, LLM, talker, vocoder) that streams text and, if asked, audio."""

from collections.abc import AsyncIterator

from pydantic import BaseModel

from prismserve.app import AppConfig
from prismserve.toy.tasks import ChatRequest, OmniTask

omni = OmniTask(model_id="toy-omni", encoder_fission=True)


class Config(AppConfig):
    tasks = {"omni": omni}


class Chunk(BaseModel):
    """One streamed piece of the answer: a text token or an audio chunk."""

    text: str | None = None
    audio_hex: str | None = None


async def serve(request: ChatRequest) -> AsyncIterator[Chunk]:
    response = await omni(request)
    async for token in response.text:
        yield Chunk(text=token)
    if response.audio is not None:
        async for chunk in response.audio:
            yield Chunk(audio_hex=chunk.hex())
