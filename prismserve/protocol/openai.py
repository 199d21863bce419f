"""OpenAI's chat-completion and image-generation wire types, as far as prismserve reads and answers them.

The request models are what the gateway validates bodies with and what `/openapi.json` documents;
the response models document the JSON the routes send (the routes build it, and the schemathesis
test checks that the two agree). Fields prismserve does not read are ignored, as OpenAI's are optional.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

_LENIENT = ConfigDict(extra="ignore")


class ImageURL(BaseModel):
    """An image or video as a base64 data URL (`data:image/png;base64,…`): the server fetches nothing."""

    url: str


class InputAudio(BaseModel):
    """A base64 audio clip (WAV)."""

    data: str
    format: str = "wav"


class TextContent(BaseModel):
    """Text in a message."""

    model_config = _LENIENT
    type: Literal["text"]
    text: str


class ImageContent(BaseModel):
    """An image in a message, as a data URL."""

    model_config = _LENIENT
    type: Literal["image_url"]
    image_url: ImageURL


class VideoContent(BaseModel):
    """A video (or animated GIF) in a message, as a data URL of a video/* or image/gif type."""

    model_config = _LENIENT
    type: Literal["video_url"]
    video_url: ImageURL


class AudioContent(BaseModel):
    """An audio clip in a message."""

    model_config = _LENIENT
    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = Annotated[TextContent | ImageContent | VideoContent | AudioContent, Field(discriminator="type")]
"""One part of a message: text, an image, a video or an audio clip, told apart by `type`."""


def _text_as_a_part(content: Any) -> Any:
    # `"content": "hi"` is shorthand for one text part; a null content (assistant turns) is none.
    if content is None:
        return []
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


class Message(BaseModel):
    """A chat message: a role and its content, a string or a list of parts."""

    model_config = _LENIENT
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[
        list[ContentPart],
        BeforeValidator(_text_as_a_part, json_schema_input_type=str | list[ContentPart] | None),
    ] = []


class AudioOptions(BaseModel):
    """How speech comes back: WAV or raw 16-bit PCM, in `voice` (one of the model's speakers; its
    first when unset)."""

    model_config = _LENIENT
    voice: str | None = None
    format: Literal["wav", "pcm16"] = "wav"


class StreamOptions(BaseModel):
    """Options of a streamed answer."""

    model_config = _LENIENT
    include_usage: bool = False


class OpenAIChatRequest(BaseModel):
    """The subset of OpenAI's chat completion request prismserve understands; `model` names the app."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"examples": [{"model": "omni", "messages": [{"role": "user", "content": "hi"}]}]},
    )
    model: str
    messages: list[Message] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None


class OpenAIImageRequest(BaseModel):
    """The fields of OpenAI's image-generation request that prismserve reads (others are ignored);
    `model` names the app, `size` is `WIDTHxHEIGHT` or `auto`."""

    model_config = ConfigDict(
        extra="ignore",
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


class Choice(BaseModel):
    """The one choice of an answer (prismserve takes n = 1 only)."""

    index: int
    message: AssistantMessage
    finish_reason: Literal["stop"]
    logprobs: None


class Usage(BaseModel):
    """Tokens: text chunks the app produced; prompt tokens are not known to the gateway (0)."""

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
