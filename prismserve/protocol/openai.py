"""OpenAI's chat-completion, image-generation and audio wire types, as far as prismserve reads and answers them.

The request models are what the gateway validates bodies with and what `/openapi.json` documents;
the response models document the JSON the routes send (the routes build it, and the schemathesis
test checks that the two agree). A field prismserve does not know is refused (a 400 naming it), not ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

# Every request model refuses fields it does not know (a 400 naming them): nothing a client sends is
# accepted and ignored.
_STRICT = ConfigDict(extra="forbid")


class ImageURL(BaseModel):
    """An image, video or audio clip as an http(s) URL the gateway fetches (within its media policy:
    allowed domains, size, timeout) or a base64 data URL (`data:image/png;base64,…`). `detail` may
    only be `auto`: the model's processor decides the resolution."""

    model_config = _STRICT
    url: str
    detail: Literal["auto"] | None = None


class InputAudio(BaseModel):
    """A base64 audio clip: `format` wav, mp3, flac or ogg (or another container PyAV decodes)."""

    model_config = _STRICT
    data: str
    format: str = "wav"


class TextContent(BaseModel):
    """Text in a message."""

    model_config = _STRICT
    type: Literal["text"]
    text: str


class ImageContent(BaseModel):
    """An image in a message, as an http(s) or data URL."""

    model_config = _STRICT
    type: Literal["image_url"]
    image_url: ImageURL


class VideoContent(BaseModel):
    """A video (MP4, WebM, animated GIF or WebP) in a message, as an http(s) URL or a data URL of a
    video/* or image/gif type."""

    model_config = _STRICT
    type: Literal["video_url"]
    video_url: ImageURL


class AudioContent(BaseModel):
    """An audio clip in a message."""

    model_config = _STRICT
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioURLContent(BaseModel):
    """An audio clip in a message as an http(s) or data URL (vLLM's `audio_url` part)."""

    model_config = _STRICT
    type: Literal["audio_url"]
    audio_url: ImageURL


ContentPart = Annotated[
    TextContent | ImageContent | VideoContent | AudioContent | AudioURLContent, Field(discriminator="type")
]
"""One part of a message: text, an image, a video or an audio clip, told apart by `type`."""


def _text_as_a_part(content: Any) -> Any:
    # `"content": "hi"` is shorthand for one text part; a null content (assistant turns) is none.
    if content is None:
        return []
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


class Message(BaseModel):
    """A chat message: a role and its content, a string or a list of parts."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[
        list[ContentPart],
        BeforeValidator(_text_as_a_part, json_schema_input_type=str | list[ContentPart] | None),
    ] = []


class AudioOptions(BaseModel):
    """How speech comes back: its file format (a stream's audio deltas are always raw 16-bit PCM,
    so `stream: true` takes `pcm16` only, as OpenAI's does), in `voice` (one of the model's
    speakers; its first when unset)."""

    model_config = _STRICT
    voice: str | None = None
    format: Literal["wav", "pcm16", "mp3", "flac", "opus", "aac"] = "wav"


class StreamOptions(BaseModel):
    """Options of a streamed answer."""

    model_config = _STRICT
    include_usage: bool = False


def _stop_list(stop: Any) -> Any:
    # `"stop": "x"` is shorthand for one stop string.
    return [stop] if isinstance(stop, str) else stop


class OpenAIChatRequest(BaseModel):
    """OpenAI's chat completion request as prismserve serves it; `model` names the app.

    Every field is honoured: a field prismserve does not know (tools, response_format, logit_bias …)
    is a 400 naming it, never accepted and ignored. Sampling fields left out follow the checkpoint's
    generation config; `top_k`, `min_p` and `repetition_penalty` are vLLM's extensions.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"model": "omni", "messages": [{"role": "user", "content": "hi"}]}]},
    )
    model: str
    messages: list[Message] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stop: Annotated[
        list[Annotated[str, Field(min_length=1)]] | None,
        BeforeValidator(_stop_list, json_schema_input_type=str | list[str] | None),
    ] = Field(default=None, max_length=4)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # the caller's end user, for their own records: nothing to do with it

    @model_validator(mode="after")
    def _logprobs_asked(self) -> OpenAIChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


class OpenAIImageRequest(BaseModel):
    """OpenAI's image-generation request as prismserve serves it (other fields are a 400 naming them);
    `model` names the app, `size` is `WIDTHxHEIGHT` or `auto`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"model": "image", "prompt": "a red square", "size": "64x64"}]},
    )

    model: str
    prompt: str
    n: int = 1
    size: str = "auto"
    response_format: Literal["b64_json", "url"] = "b64_json"
    negative_prompt: str | None = None
    seed: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    user: str | None = None  # the caller's end user, for their own records: nothing to do with it


class OpenAISpeechRequest(BaseModel):
    """OpenAI's text-to-speech request (POST /v1/audio/speech); `model` names an app that speaks."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"model": "omni", "input": "Hello there.", "voice": "Chelsie"}]},
    )

    model: str
    input: str = Field(min_length=1, max_length=4096)
    voice: str = Field(min_length=1, max_length=64)
    instructions: str | None = Field(default=None, max_length=4096)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"


class VoicesAnswer(BaseModel):
    """GET /v1/audio/voices: the names a speaking app's `voice` takes, its default first (empty:
    the app does not list them)."""

    model: str
    voices: list[str]


class OpenAITranscriptionForm(BaseModel):
    """OpenAI's transcription request (POST /v1/audio/transcriptions), a multipart form; `model`
    names an app that takes audio. `file` is the audio file (WAV, MP3, FLAC, Ogg/Opus, M4A, WebM)."""

    model_config = _STRICT

    file: bytes = Field(json_schema_extra={"format": "binary"})
    model: str
    language: str = Field(default="", max_length=32, description="ISO-639-1 code (`en`); empty: unknown")
    prompt: str = Field(default="", max_length=4096, description="Text whose spelling and style to follow")
    response_format: Literal["json", "text", "verbose_json", "srt", "vtt"] = "json"
    temperature: float = Field(default=0.0, ge=0, le=1)
    stream: bool = False


# --- answers --------------------------------------------------------------------------------------------


class AudioAnswer(BaseModel):
    """Speech in a non-streamed answer: base64 WAV (or PCM16) and its transcript."""

    id: str
    data: str
    expires_at: int
    transcript: str


class AssistantMessage(BaseModel):
    """The answer's message: the joined text, and speech when it was asked for."""

    role: Literal["assistant"]
    content: str
    audio: AudioAnswer | None = None


class TopLogprob(BaseModel):
    """An alternative token at a step, with its log-probability."""

    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobAnswer(TopLogprob):
    """A chosen token's log-probability and the most likely tokens at its step."""

    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    """The log-probabilities of the answer's tokens (with `logprobs: true`)."""

    content: list[TokenLogprobAnswer] | None


class Choice(BaseModel):
    """The one choice of an answer (prismserve takes n = 1 only)."""

    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: ChoiceLogprobs | None


class Usage(BaseModel):
    """Tokens the engine saw in the prompt (media included) and generated. An app that does not report
    them (a custom app streaming bare text chunks) counts a token per text chunk and 0 for the prompt."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionAnswer(BaseModel):
    """A `chat.completion` (with `stream: true` the route answers `chat.completion.chunk` events instead)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class GeneratedImage(BaseModel):
    """One generated image, a base64 PNG."""

    b64_json: str
    revised_prompt: None


class ImagesAnswer(BaseModel):
    """The answer of an image generation."""

    created: int
    data: list[GeneratedImage]


class TranscriptionAnswer(BaseModel):
    """The answer of a transcription with `response_format: json` (`text` answers the text as text/plain)."""

    text: str
