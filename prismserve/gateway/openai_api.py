"""OpenAI-compatible POST /v1/chat/completions for apps that speak the chat types.

`model` names the app. Messages may hold text, `image_url`, `video_url` and `audio_url` parts (http(s)
URLs the gateway fetches under its `MediaPolicy`, or base64 data URLs) and `input_audio` parts (base64
wav, mp3, flac or ogg); `modalities: ["text", "audio"]` asks for speech as well (`audio.format`: wav,
pcm16, mp3, flac, opus, aac); `stream: true` answers with `chat.completion.chunk` server-sent events.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from prismserve.app import App
from prismserve.errors import AppResponseError, ContextLengthError, InvalidRequestError
from prismserve.gateway.chat import chat_request, speaks_chat
from prismserve.gateway.http import error_event, merged, read_model, sse_event, state
from prismserve.gateway.media import (
    MediaPolicy,
    audio_from_url,
    decode_base64,
    encode_audio,
    image_from_url,
    video_from_url,
)
from prismserve.gateway.openapi import SSE_EVENTS, errors, json_body
from prismserve.gateway.serving import Served, find_app, serving
from prismserve.gateway.tools import ReplyShape, reply_shape
from prismserve.gateway.trace_recorder import TraceRecorder
from prismserve.protocol.chat import (
    AudioPart,
    ChatChunk,
    ChatCompletion,
    ChatMessage,
    ChatRequest,
    ImagePart,
    Sampling,
    TextPart,
    TokenLogprob,
    ToolCall,
    VideoPart,
)
from prismserve.protocol.openai import (
    AudioContent,
    AudioURLContent,
    ChatCompletionAnswer,
    ContentPart,
    ImageContent,
    OpenAIChatRequest,
    TextContent,
    VideoContent,
)

router = APIRouter()

T = TypeVar("T")


async def to_chat_request(
    body: OpenAIChatRequest, app: App, media: MediaPolicy | None = None, shape: ReplyShape | None = None
) -> ChatRequest:
    """The app's ChatRequest for an OpenAI request, its media URLs fetched under `media` (default
    policy if None), its reply shaped as `shape` says (default: as the request asks); a 4xx for
    media that cannot be fetched, do not decode or that the app refuses."""
    policy = media or MediaPolicy()
    shape = shape or reply_shape(body)
    counts = {"image": 0, "video": 0, "audio": 0}
    numbered = [[(part, _number(part, counts)) for part in m.content] for m in body.messages]
    decoded = await asyncio.gather(*(_part(part, i, policy) for parts in numbered for part, i in parts))
    messages, taken = [], 0
    for message, numbered_parts in zip(body.messages, numbered, strict=True):
        parts = decoded[taken : taken + len(numbered_parts)]
        taken += len(numbered_parts)
        role = "system" if message.role == "developer" else message.role
        calls = [
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
            for c in message.tool_calls or ()
        ]
        messages.append(
            ChatMessage(role=role, content=parts, tool_calls=calls, tool_call_id=message.tool_call_id)
        )
    modalities = body.modalities or ["text"]
    fields: dict[str, Any] = {"messages": messages, "modalities": modalities, **_sampling(body)}
    if shape.schema is not None:
        fields["json_schema"] = shape.schema
    if shape.tools:
        fields["tools"] = shape.tools
    if body.audio is not None and body.audio.voice is not None:
        fields["voice"] = body.audio.voice
    if body.mm_processor_kwargs is not None and body.mm_processor_kwargs.use_audio_in_video:
        fields["use_audio_in_video"] = True
    return chat_request(app, fields)


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
    arrival = gateway.trace.arrival() if gateway.trace is not None else 0.0
    body = await read_model(request, OpenAIChatRequest)
    app = find_app(gateway.runtime, body.model)
    if not speaks_chat(app):
        raise InvalidRequestError(
            f"app {app.name!r} does not take chat requests (its serve() takes {app.request_model.__name__}); "
            f"use POST /v1/apps/{app.name}/invoke",
        )
    _check_context(app, body)
    speaks = "audio" in (body.modalities or [])
    if body.stream and speaks:
        _check_streamed_audio(body)
    shape = reply_shape(body)
    chat = await to_chat_request(body, app, gateway.media, shape)
    recorded = _recorder(gateway.trace, arrival, chat)
    completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    served = [serving(request, app, one) for one in _choice_requests(chat, body.n)]
    if body.stream:
        choices = [_Choice(index, one, one.chunks()) for index, one in enumerate(served)]
        await _first_chunks(choices)  # errors before the first chunk get a proper status code
        usage = body.stream_options is not None and body.stream_options.include_usage
        events = _stream(
            choices,
            completion_id,
            include_usage=usage,
            speaks=speaks,
            with_logprobs=body.logprobs,
            recorded=recorded,
            shape=shape,
        )
        return StreamingResponse(events, media_type="text/event-stream")
    answers = await _all([collect_chat(one) for one in served])
    fmt = body.audio.format if body.audio else "wav"
    choices_json = []
    for index, answer in enumerate(answers):
        recorded(answer.tally)
        content, calls, finish_reason = shape.read(answer.text, answer.tally.finish_reason)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        if speaks:
            data = encode_audio(answer.audio, answer.sample_rate, fmt)
            message["audio"] = {
                "id": _audio_id(completion_id, index),
                "data": base64.b64encode(data).decode(),
                "expires_at": int(time.time()) + 3600,
                "transcript": answer.text,
            }
        choices_json.append(
            {
                "index": index,
                "message": message,
                "finish_reason": finish_reason,
                "logprobs": {"content": answer.tally.logprobs} if body.logprobs else None,
            }
        )
    return JSONResponse(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model,
            "choices": choices_json,
            "usage": _usage([answer.tally for answer in answers]),
        }
    )


def _check_context(app: App, body: OpenAIChatRequest) -> None:
    """A 400 `context_length_exceeded` for a `max_tokens` the app's context cannot hold beside any
    prompt (a prompt too long for what is left is found where it is counted: the engine)."""
    wanted, context = body.max_completion_tokens or body.max_tokens, app.context_length
    if wanted is not None and context is not None and wanted >= context:
        raise ContextLengthError(
            f"max_tokens is {wanted}, but the context of app {app.name!r} is {context} tokens, prompt and "
            f"reply together: ask for at most {context - 1}"
        )


def _choice_requests(chat: ChatRequest, n: int) -> list[ChatRequest]:
    """The request of each of `n` choices: the same, but with a `seed`, seed + index (each choice
    its own sample, the whole answer reproducible)."""
    if n == 1 or chat.seed is None:
        return [chat] * n
    return [chat.model_copy(update={"seed": chat.seed + index}) for index in range(n)]


async def _all(awaitables: list[Awaitable[T]]) -> list[T]:
    """Every result, concurrently; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _usage(tallies: list[Tally]) -> dict[str, int]:
    """OpenAI's `usage` of an answer of several choices: the prompt once, every choice's tokens."""
    prompt = max(tally.prompt_tokens for tally in tallies)
    completion = sum(tally.completion_tokens for tally in tallies)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _audio_id(completion_id: str, index: int) -> str:
    return f"audio-{completion_id}" + (f"-{index}" if index else "")


def _recorder(trace: TraceRecorder | None, arrival: float, chat: ChatRequest) -> Callable[[Tally], None]:
    """What to call with an answered request's tally: logs it to the trace (`--record-trace`), if any."""

    def record(tally: Tally) -> None:
        if trace is not None:
            trace.record(arrival, chat, tally.completion_tokens)

    return record


def _sampling(body: OpenAIChatRequest) -> dict[str, Any]:
    """The request's sampling fields as `ChatRequest` takes them (those it left out are left out:
    the checkpoint's generation config decides them)."""
    fields = {
        "max_tokens": body.max_completion_tokens or body.max_tokens,
        "top_logprobs": (body.top_logprobs or 0) if body.logprobs else None,
        **{name: getattr(body, name) for name in _SAMPLING},
    }
    return {name: value for name, value in fields.items() if value is not None}


# The sampling fields the API and `ChatRequest` share by name (`max_tokens` and `top_logprobs` differ).
_SAMPLING = tuple(
    name
    for name in Sampling.model_fields
    if name in OpenAIChatRequest.model_fields and name not in ("max_tokens", "top_logprobs")
)


def _number(part: ContentPart, counts: dict[str, int]) -> int:
    """The part's index among the media of its kind (what error messages name: "image #0"); 0 for text."""
    if isinstance(part, TextContent):
        return 0
    kind = {ImageContent: "image", VideoContent: "video"}.get(type(part), "audio")
    counts[kind] += 1
    return counts[kind] - 1


async def _part(part: ContentPart, index: int, media: MediaPolicy) -> Any:
    """The chat type of one OpenAI content part, its media fetched (http(s) URLs) or decoded (data URLs)."""
    if isinstance(part, TextContent):
        return TextPart(text=part.text)
    if isinstance(part, ImageContent):
        data, mime = await image_from_url(part.image_url.url, index, media)
        return ImagePart(data=data, mime_type=mime)
    if isinstance(part, VideoContent):
        data, mime = await video_from_url(part.video_url.url, index, media)
        return VideoPart(data=data, mime_type=mime)
    if isinstance(part, AudioURLContent):
        data, fmt = await audio_from_url(part.audio_url.url, index, media)
        return AudioPart(data=data, format=fmt)
    assert isinstance(part, AudioContent)
    return AudioPart(
        data=decode_base64(part.input_audio.data, f"audio #{index}"), format=part.input_audio.format
    )


def _check_streamed_audio(body: OpenAIChatRequest) -> None:
    """A 400 for an `audio.format` other than pcm16 with `stream: true`: a stream's audio deltas are raw
    PCM, and OpenAI refuses the other formats alike (a format left out means pcm16 here)."""
    fmt = body.audio.format if body.audio is not None and "format" in body.audio.model_fields_set else "pcm16"
    if fmt != "pcm16":
        raise InvalidRequestError(
            f"audio.format {fmt!r} is not streamed: with stream: true, send audio.format 'pcm16' (or leave it out)"
        )


@dataclass
class Tally:
    """What an answer's chunks report, added up: tokens, the finish reason, log-probabilities in the
    API's shape. Chunks that carry no token count (custom apps' bare text) count one each."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    logprobs: list[dict[str, Any]] = field(default_factory=list)

    def add(self, chunk: ChatChunk) -> list[dict[str, Any]]:
        """Count `chunk` in; its tokens' log-probabilities in the API's shape."""
        if chunk.tokens is not None:
            self.completion_tokens += chunk.tokens
        elif chunk.text:
            self.completion_tokens += 1
        if chunk.prompt_tokens is not None:
            self.prompt_tokens = chunk.prompt_tokens
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        logprobs = [_logprob(entry) for entry in chunk.logprobs or ()]
        self.logprobs += logprobs
        return logprobs

    def usage(self) -> dict[str, int]:
        """OpenAI's `usage`."""
        return _usage([self])


def _logprob(entry: TokenLogprob) -> dict[str, Any]:
    top = [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in entry.top]
    return {"token": entry.token, "logprob": entry.logprob, "bytes": entry.bytes, "top_logprobs": top}


def _as_chat_chunk(app_name: str, chunk: BaseModel) -> ChatChunk:
    if isinstance(chunk, ChatChunk):
        return chunk
    if isinstance(chunk, ChatCompletion):
        return ChatChunk(**chunk.model_dump())
    raise AppResponseError(
        f"app {app_name!r} answered with {type(chunk).__name__}, not ChatChunk or ChatCompletion"
    )


@dataclass
class Answer:
    """A whole answer: its text, its audio (16-bit PCM at `sample_rate`) and what its chunks reported."""

    text: str
    audio: bytes
    sample_rate: int
    tally: Tally


async def chat_chunks(served: Served) -> AsyncGenerator[ChatChunk, None]:
    """A chat app's answer as chunks, whether it streams or answers whole (one chunk)."""
    results = _as_stream(await served.response()) if not served.app.streaming else served.chunks()
    async with contextlib.aclosing(results):  # closed with this one: a client that left cancels serve()
        async for result in results:
            yield _as_chat_chunk(served.app.name, result)


async def collect_chat(served: Served) -> Answer:
    """The whole answer of a chat app, streamed or not."""
    text, audio, sample_rate, tally = [], bytearray(), 24000, Tally()
    async for chunk in chat_chunks(served):
        tally.add(chunk)
        if chunk.text:
            text.append(chunk.text)
        if chunk.audio:
            audio += chunk.audio
            sample_rate = chunk.sample_rate
    return Answer("".join(text), bytes(audio), sample_rate, tally)


async def _as_stream(result: BaseModel) -> AsyncGenerator[BaseModel, None]:
    yield result


@dataclass
class _Choice:
    """One of a streamed request's `n` answers: its serving, its chunks, what they added up to."""

    index: int
    served: Served
    chunks: AsyncGenerator[BaseModel, None]
    first: BaseModel | None = None
    tally: Tally = field(default_factory=Tally)


async def _first_chunks(choices: list[_Choice]) -> None:
    """Each choice's first chunk, concurrently; the first failure closes every choice and is raised."""
    try:
        firsts = await _all([anext(choice.chunks, None) for choice in choices])
    except BaseException:
        for choice in choices:
            await choice.chunks.aclose()
        raise
    for choice, first in zip(choices, firsts, strict=True):
        choice.first = first


async def _stream(
    choices: list[_Choice],
    completion_id: str,
    *,
    include_usage: bool,
    speaks: bool = False,
    with_logprobs: bool = False,
    recorded: Callable[[Tally], None] | None = None,
    shape: ReplyShape | None = None,
) -> AsyncIterator[bytes]:
    """`chat.completion.chunk` events: each choice's role, a delta per text or audio chunk (the
    choices' interleaved as they come), its stop; [usage], [DONE]. Any error on the way ends the
    stream with an `error` event.

    When speech was asked for (`speaks`), the text goes as `delta.audio.transcript`, as OpenAI sends
    it, and a last audio delta gives `expires_at`; `delta.audio.data` is base64 PCM16 at the app's rate.
    A reply that may hold tool calls (`shape`) goes in one delta once whole: its content and calls.
    """
    served = choices[0].served  # the choices share the app and the request id
    created, model = int(time.time()), served.app.name

    def event(entries: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": entries,
            **extra,
        }
        return sse_event(json.dumps(chunk))

    for choice in choices:
        yield event([_delta(choice.index, {"role": "assistant", "content": ""})])
    shape = shape or ReplyShape()
    deltas = [
        _deltas(choice, model, completion_id, speaks, with_logprobs, recorded, shape) for choice in choices
    ]
    try:
        async for entry in merged(deltas):
            yield event([entry])
    except Exception as exc:  # noqa: BLE001 - the client hears of it as an error event
        yield error_event(served.failure(exc), served.request_id)
        return
    if include_usage:
        yield event([], usage=_usage([choice.tally for choice in choices]))
    yield sse_event("[DONE]")


def _delta(
    index: int, fields: dict[str, Any], finish: str | None = None, logprobs: Any = None
) -> dict[str, Any]:
    return {"index": index, "delta": fields, "finish_reason": finish, "logprobs": logprobs}


async def _deltas(
    choice: _Choice,
    model: str,
    completion_id: str,
    speaks: bool,
    with_logprobs: bool,
    recorded: Callable[[Tally], None] | None,
    shape: ReplyShape,
) -> AsyncGenerator[dict[str, Any], None]:
    """One choice's entries of `choices`: a delta per text or audio chunk (a reply that may hold
    tool calls: one, once whole), then its stop."""
    tally, audio_id, index = choice.tally, _audio_id(completion_id, choice.index), choice.index
    held: list[str] = []  # the text of a reply that may hold tool calls
    async with contextlib.aclosing(choice.chunks):  # closed with the stream: a client that left cancels
        result = choice.first
        while result is not None:
            chunk = _as_chat_chunk(model, result)
            logprobs = tally.add(chunk)
            if chunk.text and shape.has_calls:
                held.append(chunk.text)
            elif chunk.text:
                # With speech asked for, OpenAI sends the text as the audio's transcript.
                said = {"audio": {"id": audio_id, "transcript": chunk.text}}
                yield _delta(
                    index,
                    said if speaks else {"content": chunk.text},
                    logprobs={"content": logprobs} if with_logprobs else None,
                )
            if chunk.audio:
                yield _delta(
                    index, {"audio": {"id": audio_id, "data": base64.b64encode(chunk.audio).decode()}}
                )
            result = await anext(choice.chunks, None)
    if recorded is not None:
        recorded(tally)
    finish_reason = tally.finish_reason
    if shape.has_calls:
        text, calls, finish_reason = shape.read("".join(held), finish_reason)
        numbered = [{"index": number, **call} for number, call in enumerate(calls)]
        fields = {"content": text} | ({"tool_calls": numbered} if numbered else {})
        yield _delta(index, fields, logprobs={"content": tally.logprobs} if with_logprobs else None)
    if speaks:
        yield _delta(index, {"audio": {"id": audio_id, "expires_at": int(time.time()) + 3600}})
    yield _delta(index, {}, finish_reason)
