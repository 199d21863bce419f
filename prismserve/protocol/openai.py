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


class FunctionCall(BaseModel):
    """A call of a function: its name and its arguments as JSON text."""

    model_config = _STRICT
    name: str
    arguments: str


class MessageToolCall(BaseModel):
    """A tool call of an earlier assistant turn, as the API answered it."""

    model_config = _STRICT
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """A chat message: a role and its content, a string or a list of parts; an assistant's may hold
    the tool calls it made, a `tool` message answers one of them (`tool_call_id`)."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[
        list[ContentPart],
        BeforeValidator(_text_as_a_part, json_schema_input_type=str | list[ContentPart] | None),
    ] = []
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _tool_fields(self) -> Message:
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message needs tool_call_id, and only a tool message takes one")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message holds tool_calls")
        return self


class JSONSchemaFormat(BaseModel):
    """A JSON Schema the reply follows (`strict` or not: the grammar always holds it to the schema).
    A `description` is refused: no chat template shows it to the model."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class TextFormat(BaseModel):
    """A reply in free text (the default)."""

    model_config = _STRICT
    type: Literal["text"]


class JSONObjectFormat(BaseModel):
    """A reply that is a JSON object."""

    model_config = _STRICT
    type: Literal["json_object"]


class JSONSchemaResponseFormat(BaseModel):
    """A reply that is JSON following `json_schema.schema`."""

    model_config = _STRICT
    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = Annotated[
    TextFormat | JSONObjectFormat | JSONSchemaResponseFormat, Field(discriminator="type")
]


class FunctionDefinition(BaseModel):
    """A function the model may call: its name, what it does, its parameters as a JSON Schema."""

    model_config = _STRICT
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    """A tool: a function."""

    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    """The function a named tool choice calls."""

    model_config = _STRICT
    name: str


class NamedToolChoice(BaseModel):
    """A tool choice that makes the model call this function."""

    model_config = _STRICT
    type: Literal["function"]
    function: FunctionName


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


class MMProcessorKwargs(BaseModel):
    """vLLM's `mm_processor_kwargs` extension: how the model's processor reads the request's media.
    `use_audio_in_video`: each video's soundtrack goes to the audio encoder and in with its frames
    (the Qwen-Omni families; every video then needs a soundtrack)."""

    model_config = _STRICT
    use_audio_in_video: bool = False


class OpenAIChatRequest(BaseModel):
    """OpenAI's chat completion request as prismserve serves it; `model` names the app.

    Every field is honoured: a field prismserve does not know (logit_bias, audio prediction …) is a
    400 naming it, never accepted and ignored. `response_format` and forced tool calls hold the
    reply to a JSON Schema with a grammar, on either engine. Sampling fields left out follow the checkpoint's
    generation config; `top_k`, `min_p`, `repetition_penalty` and `mm_processor_kwargs` are vLLM's
    extensions.
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
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None  # the caller's end user, for their own records: nothing to do with it
    mm_processor_kwargs: MMProcessorKwargs | None = None

    @model_validator(mode="after")
    def _logprobs_asked(self) -> OpenAIChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @model_validator(mode="after")
    def _tools_named(self) -> OpenAIChatRequest:
        names = [tool.function.name for tool in self.tools or ()]
        if len(set(names)) < len(names):
            raise ValueError("tools: each function needs a name of its own")
        if self.tool_choice not in (None, "none") and not names:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(
                f"tool_choice names {self.tool_choice.function.name!r}, which is not among the tools"
            )
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


class AnsweredToolCall(BaseModel):
    """A function call the model made."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    """The answer's message: the joined text (null when it is tool calls alone), speech when it was
    asked for, the tool calls the model made."""

    role: Literal["assistant"]
    content: str | None
    audio: AudioAnswer | None = None
    tool_calls: list[AnsweredToolCall] | None = None


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
    """One of the answer's `n` choices."""

    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
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
