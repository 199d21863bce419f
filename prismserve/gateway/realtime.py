"""OpenAI's Realtime API over a WebSocket: `/v1/realtime?model=APP`, one session per connection.

The session keeps its conversation (text, audio and image items) and an input audio buffer; a
response is a chat request to the app (the conversation, the session's instructions as the system
message, speech asked for when the session's output modalities have audio) whose chunks go out as
the Realtime API's events while they come. The core events of the GA API are served:

- client: `session.update`, `input_audio_buffer.append` / `commit` / `clear`,
  `conversation.item.create` (messages of `input_text`, `input_audio`, `input_image`, `output_text`
  parts), `response.create`, `response.cancel`;
- server: `session.created` / `updated`, `input_audio_buffer.committed` / `cleared`,
  `conversation.item.added` / `done`, `response.created`, `response.output_item.added`,
  `response.output_text.delta`, `response.output_audio.delta`, `response.output_audio_transcript.delta`,
  their `.done`s, `response.output_item.done`, `response.done` (with the usage), `error`.

Audio is 16-bit mono PCM at 24 kHz both ways (`audio/pcm`, the API's default), base64 in the events.
A bad event (not JSON, an unknown type, fields that do not validate, a buffer or conversation past
its limit) gets an `error` event naming it and the session goes on; a response's failure ends that
response (`response.done`, status `failed`), not the session. A client that leaves cancels its
response's work. The gateway's API key applies (a bearer token, as the `openai` client sends it).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import importlib.util
import json
import uuid
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prismserve.app import App
from prismserve.errors import PrismserveError
from prismserve.gateway.chat import chat_request, speaks_chat
from prismserve.gateway.errors import as_http_error
from prismserve.gateway.http import new_request_id, state
from prismserve.gateway.media import AudioStreamEncoder, wav_bytes
from prismserve.gateway.openai_api import Tally, chat_chunks
from prismserve.gateway.serving import serving
from prismserve.protocol.chat import AudioPart, ChatMessage, ImagePart, TextPart

router = APIRouter()

RATE = 24000
"""The sample rate of the session's audio, in and out (the API's `audio/pcm`)."""
MAX_BUFFER_BYTES = 15 << 20
"""The input audio buffer's limit: about 5.5 minutes of 24 kHz PCM16."""
MAX_ITEMS = 256
"""The most items a conversation keeps."""


class AudioFormat(BaseModel):
    """The session's audio format: 16-bit PCM at 24 kHz is the one served."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000


class TurnDetection(BaseModel):
    """Server-side turn detection: silero-vad over the input audio. Speech that starts interrupts
    the response in progress (`interrupt_response`); silence of `silence_duration_ms` after speech
    commits the buffer (with `prefix_padding_ms` of the audio before the speech) and answers it
    (`create_response`)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(default=0.5, gt=0, lt=1)
    prefix_padding_ms: int = Field(default=300, ge=0, le=5000)
    silence_duration_ms: int = Field(default=500, ge=0, le=10000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: None = None


def _default_turn_detection() -> TurnDetection | None:
    """server_vad, as OpenAI's sessions start, where silero-vad is installed (prismserve[models])."""
    return TurnDetection() if importlib.util.find_spec("silero_vad") is not None else None


class AudioInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: AudioFormat = Field(default_factory=AudioFormat)
    turn_detection: TurnDetection | None = Field(default_factory=_default_turn_detection)
    transcription: None = None
    noise_reduction: None = None


class AudioOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: str | None = Field(default=None, max_length=64)
    speed: float = Field(default=1.0, ge=1.0, le=1.0, description="1.0 only: the app speaks at its own pace")


class AudioConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: AudioInput = Field(default_factory=AudioInput)
    output: AudioOutput = Field(default_factory=AudioOutput)


class SessionConfig(BaseModel):
    """What `session.update` sets (fields the gateway has nothing to do with are refused by name)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["realtime"] = "realtime"
    model: str | None = None
    instructions: str = Field(default="", max_length=16384)
    output_modalities: list[Literal["text", "audio"]] = Field(default=["audio"], min_length=1)
    audio: AudioConfig = Field(default_factory=AudioConfig)
    max_output_tokens: int | Literal["inf"] = "inf"


class SessionError(PrismserveError):
    """A client event the session cannot take: answered with an `error` event, the session goes on."""


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket, model: str | None = None) -> None:
    """A Realtime session with the app `model` (the query parameter, as the `openai` client sends it)."""
    gateway = state(websocket)
    if gateway.api_key is not None and not _authorized(websocket, gateway.api_key):
        await websocket.close(code=1008, reason="missing or incorrect API key")
        return
    await websocket.accept()
    websocket.state.request_id = new_request_id(websocket.headers.get("x-request-id", ""))
    session = RealtimeSession(websocket)
    try:
        if model is None:
            raise SessionError("name the app in the URL: /v1/realtime?model=NAME")
        session.app = gateway.runtime.registry.get(model)
        if not speaks_chat(session.app):
            raise SessionError(f"app {model!r} does not take chat requests")
        await session.send("session.created", session=session.described())
    except Exception as exc:  # noqa: BLE001 - an unknown app: said, then the connection closes
        await session.error(exc)
        await websocket.close(code=1008)
        return
    await session.run()


def _authorized(websocket: WebSocket, key: str) -> bool:
    given = websocket.headers.get("authorization", "").removeprefix("Bearer ").strip()
    return bool(given) and hmac.compare_digest(given.encode(), key.encode())


class RealtimeSession:
    """One connection's session: its settings, conversation, input audio and response in progress."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.id = f"sess_{uuid.uuid4().hex[:20]}"
        self.app: App | None = None
        self.config = SessionConfig()
        self.items: list[tuple[str, ChatMessage]] = []
        self.buffer = bytearray()
        self.heard = 0  # input samples appended in all
        self.detector: TurnDetector | None = None
        self.speaking = False  # turn detection heard speech begin and not yet end
        self.turn_item: str | None = None  # the item the speech being heard will become
        self.response: asyncio.Task[None] | None = None
        self.send_lock = asyncio.Lock()

    async def run(self) -> None:
        """Take the client's events until it leaves; then cancel what is still running for it."""
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                try:
                    if message.get("text") is None:
                        raise SessionError("events are JSON in text frames, not binary ones")
                    await self.handle(message["text"])
                except Exception as exc:  # noqa: BLE001 - the client hears of it; the session goes on
                    await self.error(exc)
        except WebSocketDisconnect:
            pass
        finally:
            if self.response is not None:
                self.response.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self.response

    async def handle(self, raw: str) -> None:
        try:
            event = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SessionError(f"the event is not JSON: {exc}") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise SessionError("an event is a JSON object with a `type`")
        handler = HANDLERS.get(event["type"])
        if handler is None:
            raise SessionError(
                f"unknown event type {event['type']!r}; this server takes {', '.join(HANDLERS)}"
            )
        await handler(self, event)

    # --- client events --------------------------------------------------------------------------

    async def session_update(self, event: dict[str, Any]) -> None:
        update = event.get("session") or {}
        if not isinstance(update, dict):
            raise SessionError("session.update: session must be an object")
        try:
            config = SessionConfig.model_validate(_merged(self.config.model_dump(), update))
        except ValidationError as exc:
            raise SessionError(f"session.update: {_first_error(exc)}") from None
        assert self.app is not None
        if config.model not in (None, self.app.name):
            raise SessionError(
                f"session.update: model {config.model!r} is not this session's app {self.app.name!r} "
                "(the app is chosen in the URL, /v1/realtime?model=NAME)"
            )
        self.config = config
        self.detector = None  # made anew for the new settings on the next audio
        await self.send("session.updated", session=self.described())

    async def buffer_append(self, event: dict[str, Any]) -> None:
        audio = _base64(event.get("audio"), "input_audio_buffer.append: audio")
        audio = audio[: len(audio) - len(audio) % 2]
        if len(self.buffer) + len(audio) > MAX_BUFFER_BYTES:
            raise SessionError(
                f"input_audio_buffer.append: the buffer would pass its {MAX_BUFFER_BYTES >> 20} MiB: commit or clear it"
            )
        self.buffer += audio
        self.heard += len(audio) // 2
        settings = self.config.audio.input.turn_detection
        if settings is None:
            return
        if self.detector is None:
            self.detector = await asyncio.to_thread(TurnDetector, settings)
        for kind, sample in await asyncio.to_thread(self.detector.push, audio):
            await (self.speech_started if kind == "start" else self.speech_stopped)(sample, settings)
        if not self.speaking:  # silence: only the padding a next turn would start with is kept
            keep = settings.prefix_padding_ms * RATE // 1000 * 2
            del self.buffer[: max(0, len(self.buffer) - keep)]

    async def speech_started(self, sample: int, settings: TurnDetection) -> None:
        """Speech began at input sample `sample`: the turn starts `prefix_padding_ms` before it, and
        a response in progress is interrupted (barge-in)."""
        self.speaking = True
        start = self.heard - len(self.buffer) // 2  # the input sample the buffer starts at
        first = max(start, sample - settings.prefix_padding_ms * RATE // 1000)
        del self.buffer[: (first - start) * 2]
        self.turn_item = f"item_{uuid.uuid4().hex[:20]}"
        await self.send(
            "input_audio_buffer.speech_started", audio_start_ms=sample * 1000 // RATE, item_id=self.turn_item
        )
        if settings.interrupt_response and self.response is not None and not self.response.done():
            self.response.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.response

    async def speech_stopped(self, sample: int, settings: TurnDetection) -> None:
        """Silence long enough after speech: the turn is committed, and answered."""
        self.speaking = False
        await self.send(
            "input_audio_buffer.speech_stopped", audio_end_ms=sample * 1000 // RATE, item_id=self.turn_item
        )
        await self.commit(self.turn_item)
        if settings.create_response and (self.response is None or self.response.done()):
            self.response = asyncio.get_running_loop().create_task(self.respond(self.config))

    async def buffer_commit(self, event: dict[str, Any]) -> None:
        if len(self.buffer) < 2:
            raise SessionError("input_audio_buffer.commit: the buffer is empty")
        await self.commit(None)

    async def commit(self, item_id: str | None) -> None:
        """The buffer becomes the user's audio item (`item_id`, or a new one)."""
        pcm, self.buffer = bytes(self.buffer), bytearray()
        message = ChatMessage(role="user", content=[AudioPart(data=wav_bytes(pcm, RATE))])
        item_id = await self.add(message, item_id)
        await self.send("input_audio_buffer.committed", item_id=item_id, previous_item_id=None)

    async def buffer_clear(self, event: dict[str, Any]) -> None:
        self.buffer = bytearray()
        await self.send("input_audio_buffer.cleared")

    async def item_create(self, event: dict[str, Any]) -> None:
        item = event.get("item")
        if not isinstance(item, dict) or item.get("type") != "message":
            raise SessionError(
                "conversation.item.create: the item must be a message ({'type': 'message', …})"
            )
        role = item.get("role")
        if role not in ("user", "system", "assistant"):
            raise SessionError(f"conversation.item.create: role {role!r} is not user, system or assistant")
        parts: list[Any] = [_part(part) for part in item.get("content") or []]
        if not parts:
            raise SessionError("conversation.item.create: the message has no content")
        await self.add(ChatMessage(role=role, content=parts))

    async def response_create(self, event: dict[str, Any]) -> None:
        if self.response is not None and not self.response.done():
            raise SessionError(
                "response.create: a response is in progress: cancel it first (response.cancel)"
            )
        options = event.get("response") or {}
        config = self.config
        if options:
            fields = {k: v for k, v in options.items() if k in ("instructions", "output_modalities", "audio")}
            try:
                config = SessionConfig.model_validate(_merged(config.model_dump(), fields))
            except ValidationError as exc:
                raise SessionError(f"response.create: {_first_error(exc)}") from None
        self.response = asyncio.get_running_loop().create_task(self.respond(config))

    async def response_cancel(self, event: dict[str, Any]) -> None:
        if self.response is None or self.response.done():
            raise SessionError("response.cancel: no response is in progress")
        self.response.cancel()

    # --- a response -----------------------------------------------------------------------------

    async def respond(self, config: SessionConfig) -> None:
        """One response: the app's answer to the conversation, sent as it comes."""
        assert self.app is not None
        response_id, item_id = f"resp_{uuid.uuid4().hex[:20]}", f"item_{uuid.uuid4().hex[:20]}"
        speaks = "audio" in config.output_modalities
        await self.send("response.created", response=_response(response_id, "in_progress", config))
        item: dict[str, Any] = {
            "id": item_id,
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        await self.send("response.output_item.added", response_id=response_id, output_index=0, item=item)
        where = {"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0}
        text, tally, status, failure = [], Tally(), "completed", None
        encoder = AudioStreamEncoder("pcm", RATE)
        try:
            chat = self.chat(config, speaks)
            async for chunk in chat_chunks(serving(self.websocket, self.app, chat)):
                tally.add(chunk)
                if chunk.text:
                    text.append(chunk.text)
                    kind = (
                        "response.output_audio_transcript.delta" if speaks else "response.output_text.delta"
                    )
                    await self.send(kind, **where, delta=chunk.text)
                if chunk.audio and speaks:
                    pcm = await asyncio.to_thread(encoder.feed, chunk.audio, chunk.sample_rate)
                    if pcm:
                        await self.send(
                            "response.output_audio.delta", **where, delta=base64.b64encode(pcm).decode()
                        )
        except asyncio.CancelledError:
            status = "cancelled"
        except Exception as exc:  # noqa: BLE001 - the response fails, the session goes on
            status, failure = "failed", exc
        if status == "completed":
            if speaks:
                await self.send("response.output_audio.done", **where)
                await self.send("response.output_audio_transcript.done", **where, transcript="".join(text))
            else:
                await self.send("response.output_text.done", **where, text="".join(text))
        said = "".join(text)
        content = [
            {"type": "output_audio" if speaks else "output_text", ("transcript" if speaks else "text"): said}
        ]
        item = {**item, "status": "completed" if status == "completed" else "incomplete", "content": content}
        if said:
            self.items.append((item_id, ChatMessage(role="assistant", content=[TextPart(text=said)])))
        await self.send("response.output_item.done", response_id=response_id, output_index=0, item=item)
        done = _response(response_id, status, config, [item], _usage(tally))
        if failure is not None:
            done["status_details"] = {"type": "failed", "error": self.error_body(failure)["error"]}
        await self.send("response.done", response=done)

    def chat(self, config: SessionConfig, speaks: bool) -> Any:
        """The app's chat request for the conversation so far."""
        assert self.app is not None
        messages = [message for _, message in self.items]
        if config.instructions:
            messages.insert(0, ChatMessage(role="system", content=[TextPart(text=config.instructions)]))
        fields: dict[str, Any] = {
            "messages": messages,
            "modalities": ["text", "audio"] if speaks else ["text"],
        }
        if speaks and config.audio.output.voice is not None:
            fields["voice"] = config.audio.output.voice
        if config.max_output_tokens != "inf":
            fields["max_tokens"] = config.max_output_tokens
        return chat_request(self.app, fields)

    # --- sending --------------------------------------------------------------------------------

    async def add(self, message: ChatMessage, item_id: str | None = None) -> str:
        """Add a message to the conversation (as `item_id`, or a new id); its item id."""
        if len(self.items) >= MAX_ITEMS:
            raise SessionError(f"the conversation holds its {MAX_ITEMS} items: start a new session")
        item_id = item_id or f"item_{uuid.uuid4().hex[:20]}"
        self.items.append((item_id, message))
        item = {"id": item_id, "type": "message", "role": message.role, "status": "completed"}
        previous = self.items[-2][0] if len(self.items) > 1 else None
        await self.send("conversation.item.added", previous_item_id=previous, item=item)
        await self.send("conversation.item.done", previous_item_id=previous, item=item)
        return item_id

    async def send(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, "event_id": f"event_{uuid.uuid4().hex[:20]}", **fields}
        async with self.send_lock:  # a response's task and the session's both send
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client left meanwhile
                await self.websocket.send_text(json.dumps(event))

    def error_body(self, exc: Exception) -> dict[str, Any]:
        if isinstance(exc, SessionError):
            return {"error": {"type": "invalid_request_error", "code": "invalid_event", "message": str(exc)}}
        return as_http_error(exc, self.websocket.state.request_id, "realtime session").body(
            self.websocket.state.request_id
        )

    async def error(self, exc: Exception) -> None:
        await self.send("error", **self.error_body(exc))

    def described(self) -> dict[str, Any]:
        """The session as `session.created` / `updated` show it."""
        config = self.config.model_dump()
        return {
            **config,
            "id": self.id,
            "object": "realtime.session",
            "model": self.app.name if self.app else None,
        }


HANDLERS = {
    "session.update": RealtimeSession.session_update,
    "input_audio_buffer.append": RealtimeSession.buffer_append,
    "input_audio_buffer.commit": RealtimeSession.buffer_commit,
    "input_audio_buffer.clear": RealtimeSession.buffer_clear,
    "conversation.item.create": RealtimeSession.item_create,
    "response.create": RealtimeSession.response_create,
    "response.cancel": RealtimeSession.response_cancel,
}


def _part(part: Any) -> TextPart | AudioPart | ImagePart:
    """A message part of the conversation from an item's content part."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        return TextPart(text=str(part.get("text", "")))
    if kind == "input_audio":
        return AudioPart(data=wav_bytes(_base64(part.get("audio"), "input_audio: audio"), RATE))
    if kind == "input_image":
        url = str(part.get("image_url", ""))
        head, _, data = url.partition(",")
        if not (head.startswith("data:image/") and head.endswith(";base64")):
            raise SessionError("input_image: image_url must be a base64 data URL (data:image/png;base64,…)")
        return ImagePart(
            data=_base64(data, "input_image: image_url"), mime_type=head[5:].removesuffix(";base64")
        )
    raise SessionError(
        f"content part type {kind!r} is not input_text, input_audio, input_image or output_text"
    )


def _base64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise SessionError(f"{what} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise SessionError(f"{what} is not valid base64") from None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"


def _usage(tally: Tally) -> dict[str, int]:
    return {
        "input_tokens": tally.prompt_tokens,
        "output_tokens": tally.completion_tokens,
        "total_tokens": tally.prompt_tokens + tally.completion_tokens,
    }


def _response(
    response_id: str,
    status: str,
    config: SessionConfig,
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "output": output or [],
        "output_modalities": config.output_modalities,
        "usage": usage,
    }


class TurnDetector:
    """silero-vad over the session's 24 kHz input, resampled to its 16 kHz in windows of 512
    samples; `push` gives the speech starts and ends it heard, at input sample positions."""

    WINDOW = 512  # silero-vad's window at 16 kHz

    def __init__(self, settings: TurnDetection) -> None:
        from silero_vad import VADIterator, load_silero_vad

        self.vad = VADIterator(
            load_silero_vad(),
            threshold=settings.threshold,
            sampling_rate=16000,
            min_silence_duration_ms=settings.silence_duration_ms,
            speech_pad_ms=0,
        )
        self.resampler = AudioStreamEncoder("pcm", 16000)
        self.pending = np.zeros(0, np.float32)

    def push(self, pcm: bytes) -> list[tuple[str, int]]:
        import torch

        samples = np.frombuffer(self.resampler.feed(pcm, RATE), "<i2").astype(np.float32) / 32768
        self.pending = np.concatenate([self.pending, samples])
        heard = []
        while len(self.pending) >= self.WINDOW:
            window, self.pending = self.pending[: self.WINDOW], self.pending[self.WINDOW :]
            found = self.vad(torch.from_numpy(window.copy()))
            for kind in ("start", "end"):
                if found and kind in found:
                    heard.append((kind, int(found[kind]) * RATE // 16000))
        return heard


def _merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`base` with `update`'s fields: objects merged field by field, anything else replaced."""
    out = dict(base)
    for key, value in update.items():
        out[key] = (
            _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out
