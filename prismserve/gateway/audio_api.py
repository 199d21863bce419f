"""OpenAI-compatible POST /v1/audio/speech and POST /v1/audio/transcriptions, served by chat apps.

Neither needs an app of its own kind: speech is a chat request to an app that speaks (its
`Config.output_modalities` has "audio") asking it to say the input word for word, in `voice`;
a transcription is a chat request to an app that takes audio (`input_modalities` has "audio") with
the clip and an instruction to transcribe it. A parameter the gateway cannot honour (`speed` other
than 1, timestamps, streaming) is a 400 naming it, never silently ignored.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from prismserve.app import App
from prismserve.errors import AppResponseError, InvalidRequestError, UnsupportedMediaTypeError
from prismserve.gateway.chat import chat_request, speaks_chat
from prismserve.gateway.errors import invalid
from prismserve.gateway.http import read_bytes, read_model, state
from prismserve.gateway.media import (
    AUDIO_CONTENT_TYPES,
    decode_audio,
    encode_audio,
    resample_pcm16,
    wav_bytes,
)
from prismserve.gateway.openai_api import collect_chat
from prismserve.gateway.openapi import errors, form_body, json_body
from prismserve.gateway.serving import find_app, serving
from prismserve.protocol.chat import AudioPart, ChatMessage, TextPart
from prismserve.protocol.openai import OpenAISpeechRequest, OpenAITranscriptionForm, TranscriptionAnswer

router = APIRouter()

PCM_RATE = 24000
"""The rate of `response_format: pcm` speech: OpenAI's raw PCM is 24 kHz, whatever the app's rate."""

SPEAK = "Say the user's text aloud, word for word, adding nothing."
TRANSCRIBE = "Transcribe the speech in the user's audio word for word. Answer with the transcript only."

_UNSUPPORTED_FORM_FIELDS = (
    "timestamp_granularities[]",
    "timestamp_granularities",
    "include[]",
    "chunking_strategy",
)

_AUDIO_BODY = {"schema": {"type": "string", "format": "binary"}}


@router.post(
    "/v1/audio/speech",
    openapi_extra=json_body(OpenAISpeechRequest),
    responses={
        200: {
            "description": "The speech as an audio file in `response_format` (`pcm`: raw 16-bit mono at 24 kHz)",
            "content": {
                AUDIO_CONTENT_TYPES[fmt]: _AUDIO_BODY for fmt in ("mp3", "opus", "aac", "flac", "wav", "pcm")
            },
        },
        **errors(400, 404, 413, 415, 500, 502),
    },
    response_class=Response,
)
async def speech(request: Request) -> Response:
    """OpenAI text to speech, spoken by the app named in `model`."""
    body = await read_model(request, OpenAISpeechRequest)
    app = find_app(state(request).runtime, body.model)
    _check_chat_app(app, "/v1/audio/speech")
    if "audio" not in app.config.output_modalities:
        raise InvalidRequestError(
            f"app {app.name!r} cannot speak: /v1/audio/speech needs an app whose Config.output_modalities "
            f"contains 'audio' (it produces {', '.join(sorted(app.config.output_modalities))})"
        )
    if body.speed != 1.0:
        raise InvalidRequestError(f"speed {body.speed:g} is not supported: the app speaks at speed 1.0 only")
    if body.stream_format != "audio":
        raise InvalidRequestError("stream_format 'sse' is not supported: leave it out (or send 'audio')")
    system = SPEAK + (f" {body.instructions}" if body.instructions else "")
    messages = [ChatMessage(role="system", content=[TextPart(text=system)])]
    messages.append(ChatMessage(role="user", content=[TextPart(text=body.input)]))
    chat = chat_request(app, {"messages": messages, "modalities": ["text", "audio"], "voice": body.voice})
    answer = await collect_chat(serving(request, app, chat))
    pcm, sample_rate = answer.audio, answer.sample_rate
    if not pcm:
        raise AppResponseError(f"app {app.name!r} answered a speech request without audio")
    fmt = body.response_format
    if fmt == "pcm":
        pcm, sample_rate = resample_pcm16(pcm, sample_rate, PCM_RATE), PCM_RATE
    # Encoding and decoding run off the event loop: a long clip takes a while.
    audio = await asyncio.to_thread(encode_audio, pcm, sample_rate, fmt)
    return Response(audio, media_type=AUDIO_CONTENT_TYPES[fmt])


@router.post(
    "/v1/audio/transcriptions",
    openapi_extra=form_body(OpenAITranscriptionForm),
    responses={
        200: {
            "model": TranscriptionAnswer,
            "description": 'The transcript: JSON `{"text"}`, or the text itself with `response_format: text`',
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **errors(400, 404, 413, 415, 500, 502),
    },
)
async def transcriptions(request: Request) -> Response:
    """OpenAI transcription, by the app named in `model` (a multipart form with the audio `file`)."""
    form = await _read_form(request)
    for field in _UNSUPPORTED_FORM_FIELDS:
        if field in form:
            raise InvalidRequestError(f"{field} is not supported: the app's transcript has no timestamps")
    try:
        body = OpenAITranscriptionForm.model_validate(form)
    except ValidationError as exc:
        raise invalid(exc) from None
    app = find_app(state(request).runtime, body.model)
    _check_chat_app(app, "/v1/audio/transcriptions")
    if "audio" not in app.config.input_modalities:
        raise InvalidRequestError(
            f"app {app.name!r} does not take audio: /v1/audio/transcriptions needs an app whose "
            f"Config.input_modalities contains 'audio' (it takes {', '.join(sorted(app.config.input_modalities))})"
        )
    if body.response_format not in ("json", "text"):
        raise InvalidRequestError(
            f"response_format {body.response_format!r} is not supported (it needs timestamps the app "
            "does not give): send json or text"
        )
    if body.stream:
        raise InvalidRequestError("stream is not supported: leave it out; the transcript comes whole")
    pcm, sample_rate = await asyncio.to_thread(decode_audio, body.file, "file")
    system = TRANSCRIBE
    if body.language:
        system += f" The speech is in the language {body.language!r}."
    if body.prompt:
        system += f" Follow the spelling and style of this text: {body.prompt}"
    messages = [
        ChatMessage(role="system", content=[TextPart(text=system)]),
        ChatMessage(role="user", content=[AudioPart(data=wav_bytes(pcm, sample_rate), format="wav")]),
    ]
    fields = {"messages": messages, "modalities": ["text"], "temperature": body.temperature}
    text = (await collect_chat(serving(request, app, chat_request(app, fields)))).text
    if body.response_format == "text":
        return PlainTextResponse(text)
    return JSONResponse(TranscriptionAnswer(text=text).model_dump())


def _check_chat_app(app: App, route: str) -> None:
    if not speaks_chat(app):
        raise InvalidRequestError(
            f"app {app.name!r} does not take chat requests (its serve() takes {app.request_model.__name__}), "
            f"which {route} sends; use POST /v1/apps/{app.name}/invoke"
        )


async def _read_form(request: Request) -> dict[str, str | bytes]:
    """The multipart form's fields (a file's as bytes, the last of a repeated field); 415 for another
    Content-Type, 413 past the gateway's body limit, 400 for a form that does not parse."""
    content_type = request.headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() != "multipart/form-data":
        raise UnsupportedMediaTypeError(
            f"Content-Type {content_type or None!r} is not accepted: send the form as multipart/form-data "
            "(as the openai client's audio.transcriptions.create does)"
        )
    data = await read_bytes(request)

    async def whole() -> AsyncGenerator[bytes, None]:
        yield data

    try:
        form = await MultiPartParser(request.headers, whole(), max_files=4, max_fields=64).parse()
    except MultiPartException as exc:
        raise InvalidRequestError(f"malformed multipart form: {exc.message}") from None
    fields: dict[str, str | bytes] = {}
    try:
        for key, value in form.multi_items():
            fields[key] = await value.read() if isinstance(value, UploadFile) else value
    finally:
        await form.close()
    return fields
