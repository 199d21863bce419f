"""App sources, executors and media the gateway tests use."""

from __future__ import annotations

import base64
import io
import struct
import wave
import zlib
from pathlib import Path

from toy import APP_PATH
from toy.executors import EXECUTORS

TOKEN = "test-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}

OMNI = Path(APP_PATH).read_text()

ANSWER = """
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatCompletion, ChatRequest
from toy.tasks import MLLMTask

mllm = MLLMTask(model_id="m")

class Config(AppConfig):
    tasks = {"mllm": mllm}
    input_modalities = frozenset({"text", "image"})

async def serve(request: ChatRequest) -> ChatCompletion:
    tokens = await (await mllm(request)).text.collect()
    return ChatCompletion(text=" ".join(tokens))
"""

NOT_CHAT = """
from pydantic import BaseModel
from prismserve.app import AppConfig
from toy.tasks import EncoderTask, MediaInput

encoder = EncoderTask(model_id="m", modality="image")

class Config(AppConfig):
    tasks = {"encoder": encoder}

class Embed(BaseModel):
    data: str

class Embedding(BaseModel):
    values: list[float]

async def serve(request: Embed) -> Embedding:
    output = await encoder(MediaInput(modality="image", data=request.data.encode()))
    return Embedding(values=output.embedding.value)
"""

APPS = {"omni": OMNI, "answer": ANSWER, "embed": NOT_CHAT}
"""What the `gateway` fixture registers, in this order."""

GARBLED = """
from collections.abc import AsyncIterator
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatCompletion, ChatRequest
from toy.tasks import MLLMTask

class Config(AppConfig):
    tasks = {{"mllm": MLLMTask(model_id="m")}}

async def serve(request: ChatRequest) -> {returns}:
    {body}
"""
GARBLED_ANSWER = GARBLED.format(returns="ChatCompletion", body='return ChatCompletion(text="\\ud800")')
"""An app whose answer no JSON encoder takes (a lone surrogate, as a broken model may write)."""
GARBLED_STREAM = GARBLED.format(
    returns="AsyncIterator[ChatChunk]",
    body='yield ChatChunk(text="fine")\n    yield ChatChunk(text="\\ud800")',
)
"""A streaming app whose second chunk no JSON encoder takes."""

RAY_INTERNALS = ("ActorID(9f8e7d6c5b4a3f2e01000000)", "pid=31337", "10.42.0.7", "prismserve-ns-3f2a")
"""What a Ray failure's text carries and a client must not see."""
RAY_FAILURE = (
    f"The actor {RAY_INTERNALS[0]} died unexpectedly ({RAY_INTERNALS[1]}, ip={RAY_INTERNALS[2]}, "
    f"namespace={RAY_INTERNALS[3]})"
)


async def flaky_llm(task, request):
    """The toy LLM, except that prompts can make it crash: at once ("crash") or after two tokens
    ("midway"); with "ray" in the prompt the error's text is a Ray failure's, full of internals."""
    ray = "ray" in request.prompt
    if "crash" in request.prompt:
        raise RuntimeError(RAY_FAILURE if ray else "CUDA error: device-side assert")
    count = 0
    async for token in EXECUTORS["llm"](task, request):
        if count == 2 and "midway" in request.prompt:
            raise RuntimeError(RAY_FAILURE if ray else "replica lost mid-stream")
        count += 1
        yield token


def png(size: tuple[int, int] = (4, 4)) -> bytes:
    """A small real PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def bomb_png(side: int = 100_000) -> bytes:
    """A real 1×1 PNG whose header claims `side`×`side` pixels (CRC fixed): a decompression bomb to PIL."""
    data = bytearray(png((1, 1)))
    data[16:24] = struct.pack(">II", side, side)  # IHDR width, height
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # CRC of "IHDR" + its 13 bytes
    return bytes(data)


def wav(samples: int = 1600) -> bytes:
    """A real 16 kHz mono 16-bit WAV clip."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"\x01\x00" * samples)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    """Base64 text of `data`."""
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    """A base64 data URL."""
    return f"data:{mime};base64,{b64(data)}"


def chat_body(text: str) -> dict:
    """A one-message ChatRequest as JSON (the invoke API's format)."""
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}


def sse_events(lines) -> list[tuple[str | None, str]]:
    """(event, data) pairs of a server-sent event stream's lines."""
    events, event = [], None
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            events.append((event, line[6:]))
            event = None
    return events


VOICE = """
import io
import math
import struct
import wave

from prismserve.app import AppConfig
from prismserve.errors import InvalidInputError
from prismserve.protocol.chat import ChatCompletion, ChatRequest
from toy.tasks import MLLMTask

SAMPLES_PER_WORD = 2400  # 0.1 s at 24 kHz
VOICES = ("alloy", "verse")

def voices():
    return VOICES

class Config(AppConfig):
    tasks = {"mllm": MLLMTask(model_id="m")}  # declared (an app needs one), never called
    input_modalities = frozenset({"text", "audio"})
    output_modalities = frozenset({"text", "audio"})
    voices = voices

async def serve(request: ChatRequest) -> ChatCompletion:
    if request.voice is not None and request.voice not in VOICES:
        raise InvalidInputError(f"unknown voice {request.voice!r}: this app has {', '.join(VOICES)}")
    if request.audios:
        with wave.open(io.BytesIO(request.audios[-1].data)) as clip:
            text = f"heard {clip.getnframes()} samples at {clip.getframerate()} Hz"
    else:
        text = request.messages[-1].text
    system = " ".join(m.text for m in request.messages if m.role == "system")
    if "language 'fr'" in system:
        text = "fr: " + text
    audio = b""
    if request.wants_audio:
        count = SAMPLES_PER_WORD * len(text.split())
        audio = b"".join(struct.pack("<h", int(8000 * math.sin(i / 10))) for i in range(count))
    return ChatCompletion(text=text, audio=audio or None)
"""
"""A fake speaking, listening app (computed in serve(), no task called): it "transcribes" a clip as its sample count and rate,
echoes text otherwise, and speaks 2400 samples (0.1 s at 24 kHz) of a tone per word of its answer."""

VOICE_SAMPLES_PER_WORD = 2400

SPEAKER = """
import asyncio
import math
import os
import struct
from collections.abc import AsyncIterator

from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from toy.tasks import MLLMTask

class Config(AppConfig):
    tasks = {"mllm": MLLMTask(model_id="m")}  # declared (an app needs one), never called
    output_modalities = frozenset({"text", "audio"})

async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    for word in request.messages[-1].text.split():
        if word.startswith("/"):  # a gate: go on once the file it names exists
            while not os.path.exists(word):
                await asyncio.sleep(0.01)
        elif word == "fail":
            raise RuntimeError("the vocoder broke")
        else:
            audio = b"".join(struct.pack("<h", int(8000 * math.sin(i / 10))) for i in range(2400))
            yield ChatChunk(text=word + " ", audio=audio, tokens=1, prompt_tokens=5)
"""
"""A fake speaking app that streams: per word a chunk of its text and 2400 samples (0.1 s at 24 kHz)
of a tone; a word that is a path waits for that file to exist, `fail` fails the answer there."""


def wait_for_health(url: str, timeout: float = 30) -> None:
    """Wait until `url`/health answers 200 (TimeoutError after `timeout` seconds)."""
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/health did not answer within {timeout} s")
        time.sleep(0.02)
