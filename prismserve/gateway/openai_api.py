"""OpenAI-compatible POST /v1/chat/completions for apps that speak the chat types.

`model` names the app. Messages may hold text, `image_url` parts (base64 data URLs) and
`input_audio` parts (base64 WAV); `modalities: ["text", "audio"]` asks for speech as well;
`stream: true` answers with `chat.completion.chunk` server-sent events.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prismserve.app import App
from prismserve.app.chat import AudioPart, ChatChunk, ChatCompletion, ChatMessage, ChatRequest, ImagePart, TextPart
from prismserve.gateway.errors import HTTPError, validation_message
from prismserve.gateway.http import parse_json, read_body, sse_event, state
from prismserve.gateway.media import check_audio, decode_base64, image_from_url, wav_bytes
from prismserve.gateway.serving import Served, find_app

router = APIRouter()


class _ImageURL(BaseModel):
    url: str


class _InputAudio(BaseModel):
    data: str
    format: str = "wav"


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "image_url", "input_audio"]
    text: str | None = None
    image_url: _ImageURL | None = None
    input_audio: _InputAudio | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_Part] | None = None


class _AudioOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    voice: str | None = None
    format: Literal["wav", "pcm16"] = "wav"


class OpenAIChatRequest(BaseModel):
    """The subset of OpenAI's chat completion request prismserve understands."""

    model_config = ConfigDict(extra="ignore")
    model: str
    messages: list[_Message] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: _AudioOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False


def to_chat_request(body: OpenAIChatRequest, app: App) -> ChatRequest:
    """The app's ChatRequest for an OpenAI request; 400 for media that do not decode or that the app refuses."""
    messages, images, audios = [], 0, 0
    for message in body.messages:
        content = message.content if isinstance(message.content, list) else [_Part(type="text", text=message.content or "")]
        parts: list[Any] = []
        for part in content:
            if part.type == "text":
                parts.append(TextPart(text=part.text or ""))
            elif part.type == "image_url":
                if part.image_url is None:
                    raise HTTPError(400, "an image_url part needs image_url.url")
                data, mime = image_from_url(part.image_url.url, images)
                parts.append(ImagePart(data=data, mime_type=mime))
                images += 1
            else:
                if part.input_audio is None:
                    raise HTTPError(400, "an input_audio part needs input_audio.data and .format")
                data = decode_base64(part.input_audio.data, f"audio #{audios}")
                check_audio(data, part.input_audio.format, audios)
                parts.append(AudioPart(data=data, format=part.input_audio.format))
                audios += 1
        role = "system" if message.role == "developer" else message.role
        messages.append(ChatMessage(role=role, content=parts))
    modalities = body.modalities or ["text"]
    accepted, produced = app.config.input_modalities, app.config.output_modalities
    for kind, count in (("image", images), ("audio", audios)):
        if count and kind not in accepted:
            raise HTTPError(400, f"app {app.name!r} does not accept {kind} input (it accepts {', '.join(sorted(accepted))})")
    for kind in modalities:
        if kind not in produced:
            raise HTTPError(400, f"app {app.name!r} does not produce {kind} output (it produces {', '.join(sorted(produced))})")
    fields: dict[str, Any] = {"messages": messages, "modalities": modalities}
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    if body.temperature is not None:
        fields["temperature"] = body.temperature
    if body.seed is not None:
        fields["seed"] = body.seed
    try:
        return app.request_type.model_validate(fields)  # type: ignore[return-value]
    except ValidationError as exc:
        raise HTTPError(400, validation_message(exc)) from None


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, served by the app named in `model`."""
    gateway = state(request)
    try:
        body = OpenAIChatRequest.model_validate(parse_json(await read_body(request)))
    except ValidationError as exc:
        raise HTTPError(400, validation_message(exc)) from None
    app = find_app(gateway.runtime, body.model)
    if not issubclass(app.request_type, ChatRequest):
        raise HTTPError(
            400,
            f"app {app.name!r} does not take chat requests (its serve() takes {app.request_type.__name__}); "
            f"use POST /v1/apps/{app.name}/invoke",
        )
    served = Served(gateway.runtime, gateway.metrics, app, to_chat_request(body, app))
    completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    if body.stream:
        chunks = served.chunks()
        first = await anext(chunks, None)  # errors before the first chunk get a proper status code
        return StreamingResponse(_stream(completion_id, body.model, first, chunks), media_type="text/event-stream")
    text, audio, sample_rate, count = await _collect(served)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if "audio" in (body.modalities or []):
        fmt = body.audio.format if body.audio else "wav"
        data = wav_bytes(audio, sample_rate) if fmt == "wav" else audio
        message["audio"] = {
            "id": f"audio-{completion_id}",
            "data": base64.b64encode(data).decode(),
            "expires_at": int(time.time()) + 3600,
            "transcript": text,
        }
    return JSONResponse(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 0, "completion_tokens": count, "total_tokens": count},
        }
    )


async def _collect(served: Served) -> tuple[str, bytes, int, int]:
    if not served.app.streaming:
        result = await served.response()
        if not isinstance(result, ChatCompletion):
            raise HTTPError(500, f"app {served.app.name!r} returned {type(result).__name__}, not a ChatCompletion")
        return result.text, result.audio or b"", result.sample_rate, 1 if result.text else 0
    text, audio, sample_rate, count = [], bytearray(), 24000, 0
    async for chunk in served.chunks():
        if not isinstance(chunk, ChatChunk):
            raise HTTPError(500, f"app {served.app.name!r} streamed {type(chunk).__name__}, not ChatChunk")
        if chunk.text:
            text.append(chunk.text)
            count += 1
        if chunk.audio:
            audio += chunk.audio
            sample_rate = chunk.sample_rate
    return "".join(text), bytes(audio), sample_rate, count


async def _stream(completion_id: str, model: str, first: BaseModel | None, rest: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    created = int(time.time())

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return sse_event(json.dumps(chunk))

    yield event({"role": "assistant", "content": ""})
    try:
        chunk = first
        while chunk is not None:
            if isinstance(chunk, ChatCompletion):
                chunk = ChatChunk(text=chunk.text, audio=chunk.audio, sample_rate=chunk.sample_rate)
            if isinstance(chunk, ChatChunk):
                if chunk.text:
                    yield event({"content": chunk.text})
                if chunk.audio:
                    yield event({"audio": {"id": f"audio-{completion_id}", "data": base64.b64encode(chunk.audio).decode()}})
            chunk = await anext(rest, None)
    except HTTPError as exc:
        yield sse_event(json.dumps({"error": {"message": exc.message, "type": exc.kind, "code": exc.status}}), "error")
        return
    yield event({}, "stop")
    yield sse_event("[DONE]")
