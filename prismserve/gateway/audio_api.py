"""OpenAI-compatible POST /v1/audio/speech and POST /v1/audio/transcriptions, served by chat apps, and
GET /v1/audio/voices, the voices of an app that speaks.

Neither needs an app of its own kind: speech is a chat request to an app that speaks (its
`Config.output_modalities` has "audio") asking it to say the input word for word, in `voice`;
a transcription is a chat request to an app that takes audio (`input_modalities` has "audio") with
the clip and an instruction to transcribe it. A parameter the gateway cannot honour (`speed` other
than 1, timestamps, a streamed transcript) is a 400 naming it, never silently ignored.

Speech streams as the app speaks: the file in `response_format` goes out chunk by chunk as its
audio arrives (`stream_format: "audio"`), or as OpenAI's `speech.audio.delta` / `speech.audio.done`
server-sent events (`"sse"`). An error before the first audio gets its status code; a later one
ends the SSE stream with an `error` event, or cuts the audio stream short (no status is left to
send).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from prismserve.app import App
from prismserve.errors import AppResponseError, InvalidRequestError, UnsupportedMediaTypeError
from prismserve.gateway.chat import chat_request, speaks_chat
from prismserve.gateway.errors import invalid
from prismserve.gateway.http import error_event, read_bytes, read_model, sse_event, state
from prismserve.gateway.media import AUDIO_CONTENT_TYPES, AudioStreamEncoder, decode_audio, wav_bytes
from prismserve.gateway.openai_api import Tally, chat_chunks, collect_chat
from prismserve.gateway.openapi import SSE_EVENTS, errors, form_body, json_body
from prismserve.gateway.serving import Served, find_app, serving
from prismserve.protocol.chat import AudioPart, ChatChunk, ChatMessage, TextPart
from prismserve.protocol.openai import (
    OpenAISpeechRequest,
    OpenAITranscriptionForm,
    TranscriptionAnswer,
    VoicesAnswer,
)

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
SPEECH_EVENTS = {
    "text/event-stream": {
        "schema": {
            **SSE_EVENTS["text/event-stream"]["schema"],
            "description": "One server-sent event: a `speech.audio.delta`, or the last, `speech.audio.done`, as "
            "JSON; a failure after the status was sent ends the stream with an `error` event",
        }
    }
}


@router.post(
    "/v1/audio/speech",
    openapi_extra=json_body(OpenAISpeechRequest),
    responses={
        200: {
            "description": "The speech as an audio file in `response_format` (`pcm`: raw 16-bit mono at 24 kHz), "
            "streamed as it is spoken; with `stream_format: sse`, `speech.audio.delta` events (base64 pieces of "
            "that file) and a last `speech.audio.done` with the usage (or an `error` event)",
            "content": {
                **{
                    AUDIO_CONTENT_TYPES[fmt]: _AUDIO_BODY
                    for fmt in ("mp3", "opus", "aac", "flac", "wav", "pcm")
                },
                **SPEECH_EVENTS,
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
    _check_speaks(app, "/v1/audio/speech")
    if body.speed != 1.0:
        raise InvalidRequestError(f"speed {body.speed:g} is not supported: the app speaks at speed 1.0 only")
    system = SPEAK + (f" {body.instructions}" if body.instructions else "")
    messages = [ChatMessage(role="system", content=[TextPart(text=system)])]
    messages.append(ChatMessage(role="user", content=[TextPart(text=body.input)]))
    chat = chat_request(app, {"messages": messages, "modalities": ["text", "audio"], "voice": body.voice})
    served = serving(request, app, chat)
    chunks, tally = chat_chunks(served), Tally()
    first = await _first_audio(app, chunks, tally)  # errors before any audio get their status code
    fmt = body.response_format
    encoder = AudioStreamEncoder(fmt, PCM_RATE if fmt == "pcm" else None)
    pieces = _encoded(first, chunks, encoder, tally)
    if body.stream_format == "sse":
        return StreamingResponse(_speech_events(pieces, tally, served), media_type="text/event-stream")
    return StreamingResponse(pieces, media_type=AUDIO_CONTENT_TYPES[fmt])


async def _first_audio(app: App, chunks: AsyncIterator[ChatChunk], tally: Tally) -> ChatChunk:
    """The answer's first chunk with audio (the text before it counted in `tally`); a 502 if none."""
    async for chunk in chunks:
        tally.add(chunk)
        if chunk.audio:
            return chunk
    raise AppResponseError(f"app {app.name!r} answered a speech request without audio")


async def _encoded(
    first: ChatChunk, rest: AsyncGenerator[ChatChunk, None], encoder: AudioStreamEncoder, tally: Tally
) -> AsyncIterator[bytes]:
    """The speech file's bytes as each chunk's audio is encoded (off the event loop: a whole answer
    in one chunk may be a long clip), counting the chunks in `tally`."""
    async with contextlib.aclosing(rest):  # a client that leaves cancels the app's work
        chunk: ChatChunk | None = first
        while chunk is not None:
            if chunk.audio:
                piece = await asyncio.to_thread(encoder.feed, chunk.audio, chunk.sample_rate)
                if piece:
                    yield piece
            chunk = await anext(rest, None)
            if chunk is not None:
                tally.add(chunk)
    yield await asyncio.to_thread(encoder.finish)


async def _speech_events(pieces: AsyncIterator[bytes], tally: Tally, served: Served) -> AsyncIterator[bytes]:
    """OpenAI's speech events: `speech.audio.delta` per piece (base64), `speech.audio.done` with the
    usage; an error on the way ends the stream with an `error` event."""
    try:
        async for piece in pieces:
            if piece:
                delta = {"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()}
                yield sse_event(json.dumps(delta))
    except Exception as exc:  # noqa: BLE001 - the client hears of it as an error event
        yield error_event(served.failure(exc), served.request_id)
        return
    usage = tally.usage()
    done = {
        "type": "speech.audio.done",
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
        },
    }
    yield sse_event(json.dumps(done))


@router.get("/v1/audio/voices", response_model=VoicesAnswer, responses=errors(400, 404, 500))
async def voices(request: Request, model: str | None = None) -> VoicesAnswer:
    """The voices of the speaking app `model` (left out: the one app served that speaks)."""
    runtime = state(request).runtime
    if model is None:
        speaking = sorted(a.name for a in runtime.registry.apps.values() if _speaks(a))
        if len(speaking) != 1:
            raise InvalidRequestError(
                "name the app with ?model=NAME: "
                + (f"the apps that speak are {', '.join(speaking)}" if speaking else "no app served speaks")
            )
        model = speaking[0]
    app = find_app(runtime, model)
    _check_speaks(app, "/v1/audio/voices")
    listing = app.config.voices
    names = await asyncio.to_thread(listing) if listing is not None else ()  # it may read a checkpoint
    return VoicesAnswer(model=app.name, voices=list(names))


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


def _speaks(app: App) -> bool:
    return speaks_chat(app) and "audio" in app.config.output_modalities


def _check_speaks(app: App, route: str) -> None:
    _check_chat_app(app, route)
    if "audio" not in app.config.output_modalities:
        raise InvalidRequestError(
            f"app {app.name!r} cannot speak: {route} needs an app whose Config.output_modalities "
            f"contains 'audio' (it produces {', '.join(sorted(app.config.output_modalities))})"
        )


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
