"""OpenAI-compatible POST /v1/chat/completions for apps that speak the chat types.

`model` names the app. Messages may hold text, `image_url` parts (base64 data URLs) and
`input_audio` parts (base64 WAV), `video_url` parts (base64 data URLs of video/* or image/gif); `modalities: ["text", "audio"]` asks for speech as well;
`stream: true` answers with `chat.completion.chunk` server-sent events.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from prismserve.app import App
from prismserve.errors import AppResponseError, InvalidRequestError
from prismserve.gateway.chat import check_chat_request, speaks_chat
from prismserve.gateway.errors import invalid
from prismserve.gateway.http import error_event, read_model, sse_event, state
from prismserve.gateway.media import decode_base64, image_from_url, video_from_url, wav_bytes
from prismserve.gateway.openapi import SSE_EVENTS, errors, json_body
from prismserve.gateway.serving import Served, find_app, serving
from prismserve.protocol.chat import (
    AudioPart,
    ChatChunk,
    ChatCompletion,
    ChatMessage,
    ChatRequest,
    ImagePart,
    TextPart,
    VideoPart,
)
from prismserve.protocol.openai import (
    AudioContent,
    ChatCompletionAnswer,
    ContentPart,
    ImageContent,
    OpenAIChatRequest,
    TextContent,
    VideoContent,
)

router = APIRouter()


def to_chat_request(body: OpenAIChatRequest, app: App) -> ChatRequest:
    """The app's ChatRequest for an OpenAI request; 400 for media that do not decode or that the app refuses."""
    messages, counts = [], {"image": 0, "video": 0, "audio": 0}
    for message in body.messages:
        parts = [_part(part, counts) for part in message.content]
        role = "system" if message.role == "developer" else message.role
        messages.append(ChatMessage(role=role, content=parts))
    modalities = body.modalities or ["text"]
    fields: dict[str, Any] = {"messages": messages, "modalities": modalities}
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    if body.temperature is not None:
        fields["temperature"] = body.temperature
    if body.seed is not None:
        fields["seed"] = body.seed
    if body.audio is not None and body.audio.voice is not None:
        fields["voice"] = body.audio.voice
    try:
        request: ChatRequest = app.request_type.model_validate(fields)  # type: ignore[assignment]
    except ValidationError as exc:
        raise invalid(exc) from None
    check_chat_request(app, request)
    return request


@router.post(
    "/v1/chat/completions",
    openapi_extra=json_body(OpenAIChatRequest),
    responses={
        200: {
            "model": ChatCompletionAnswer,
            "description": "A chat.completion; with `stream: true`, chat.completion.chunk server-sent events "
            "ending in `data: [DONE]` (or an `error` event)",
            "content": SSE_EVENTS,
        },
        **errors(400, 404, 413, 415, 500, 502),
    },
)
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, served by the app named in `model`."""
    gateway = state(request)
    body = await read_model(request, OpenAIChatRequest)
    app = find_app(gateway.runtime, body.model)
    if not speaks_chat(app):
        raise InvalidRequestError(
            f"app {app.name!r} does not take chat requests (its serve() takes {app.request_type.__name__}); "
            f"use POST /v1/apps/{app.name}/invoke",
        )
    served = serving(request, app, to_chat_request(body, app))
    completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    if body.stream:
        chunks = served.chunks()
        first = await anext(chunks, None)  # errors before the first chunk get a proper status code
        usage = body.stream_options is not None and body.stream_options.include_usage
        events = _stream(served, completion_id, first, chunks, include_usage=usage)
        return StreamingResponse(events, media_type="text/event-stream")
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
            "usage": _usage(count),
        }
    )


def _part(part: ContentPart, counts: dict[str, int]) -> Any:
    """The chat type of one OpenAI content part, its media decoded; `counts` numbers the media per kind."""
    if isinstance(part, TextContent):
        return TextPart(text=part.text)
    kind = {ImageContent: "image", VideoContent: "video", AudioContent: "audio"}[type(part)]
    index = counts[kind]
    counts[kind] += 1
    if isinstance(part, ImageContent):
        data, mime = image_from_url(part.image_url.url, index)
        return ImagePart(data=data, mime_type=mime)
    if isinstance(part, VideoContent):
        data, mime = video_from_url(part.video_url.url, index)
        return VideoPart(data=data, mime_type=mime)
    assert isinstance(part, AudioContent)
    return AudioPart(
        data=decode_base64(part.input_audio.data, f"audio #{index}"), format=part.input_audio.format
    )


def _usage(completion_tokens: int) -> dict[str, int]:
    # The gateway sees text chunks, not the model's tokenizer: one chunk counts as one token, and
    # prompt tokens are unknown (0).
    return {"prompt_tokens": 0, "completion_tokens": completion_tokens, "total_tokens": completion_tokens}


def _as_chat_chunk(app_name: str, chunk: BaseModel) -> ChatChunk:
    if isinstance(chunk, ChatChunk):
        return chunk
    if isinstance(chunk, ChatCompletion):
        return ChatChunk(text=chunk.text, audio=chunk.audio, sample_rate=chunk.sample_rate)
    raise AppResponseError(
        f"app {app_name!r} answered with {type(chunk).__name__}, not ChatChunk or ChatCompletion"
    )


async def _collect(served: Served) -> tuple[str, bytes, int, int]:
    """(text, pcm16 audio, sample rate, text chunk count) of a whole answer, streamed or not."""
    text, audio, sample_rate, count = [], bytearray(), 24000, 0
    results = _as_stream(await served.response()) if not served.app.streaming else served.chunks()
    async for result in results:
        chunk = _as_chat_chunk(served.app.name, result)
        if chunk.text:
            text.append(chunk.text)
            count += 1
        if chunk.audio:
            audio += chunk.audio
            sample_rate = chunk.sample_rate
    return "".join(text), bytes(audio), sample_rate, count


async def _as_stream(result: BaseModel) -> AsyncIterator[BaseModel]:
    yield result


async def _stream(
    served: Served,
    completion_id: str,
    first: BaseModel | None,
    rest: AsyncIterator[BaseModel],
    *,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """`chat.completion.chunk` events: role, a delta per text or audio chunk, stop, [usage], [DONE];
    any error on the way ends the stream with an `error` event."""
    created, model = int(time.time()), served.app.name

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
            **extra,
        }
        return sse_event(json.dumps(chunk))

    def delta(fields: dict[str, Any], finish: str | None = None) -> bytes:
        return event([{"index": 0, "delta": fields, "finish_reason": finish, "logprobs": None}])

    yield delta({"role": "assistant", "content": ""})
    count = 0
    try:
        result = first
        while result is not None:
            chunk = _as_chat_chunk(model, result)
            if chunk.text:
                count += 1
                yield delta({"content": chunk.text})
            if chunk.audio:
                yield delta(
                    {
                        "audio": {
                            "id": f"audio-{completion_id}",
                            "data": base64.b64encode(chunk.audio).decode(),
                        }
                    }
                )
            result = await anext(rest, None)
    except Exception as exc:  # noqa: BLE001 - the client hears of it as an error event
        yield error_event(served.failure(exc), served.request_id)
        return
    yield delta({}, "stop")
    if include_usage:
        yield event([], usage=_usage(count))
    yield sse_event("[DONE]")
