"""Demo app: a toy Omni model (encoders, LLM, talker, vocoder) that streams text and, if asked, audio."""

from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from toy.executors import VALUES
from toy.tasks import OmniTask

omni = OmniTask(model_id="toy-omni", encoder_fission=True)


class Config(AppConfig):
    tasks = {"omni": omni}
    input_modalities = frozenset({"text", "image", "audio"})
    output_modalities = frozenset({"text", "audio"})
    sim_values = VALUES
    context_length = 2048


async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    response = await omni(request)
    separator = ""
    async for token in response.text:
        yield ChatChunk(text=separator + token)  # text deltas, as an OpenAI client joins them
        separator = " "
    if response.audio is not None:
        async for chunk in response.audio:
            yield ChatChunk(audio=chunk)
