"""The chat wire types: what OpenAI-compatible apps take and return.

An app whose serve() takes a `ChatRequest` and returns a `ChatCompletion` (or streams `ChatChunk`s)
can be called through `/v1/chat/completions`; the gateway translates the OpenAI format to these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Modality = Literal["text", "audio"]


def _text_only() -> list[Modality]:
    return ["text"]


# Bytes (media in, audio out) travel as base64 in JSON.
_BASE64 = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")


class TextPart(BaseModel):
    """Text in a message."""

    type: Literal["text"] = "text"
    text: str


class ImagePart(BaseModel):
    """An encoded image (PNG, JPEG …) in a message."""

    model_config = _BASE64

    type: Literal["image"] = "image"
    data: bytes
    mime_type: str = "image/png"


class AudioPart(BaseModel):
    """An encoded audio clip (WAV, MP3 …) in a message."""

    model_config = _BASE64

    type: Literal["audio"] = "audio"
    data: bytes
    format: str = "wav"


class VideoPart(BaseModel):
    """An encoded video clip (MP4, WebM, animated GIF …) in a message."""

    model_config = _BASE64

    type: Literal["video"] = "video"
    data: bytes
    mime_type: str = "video/mp4"


Part = Annotated[TextPart | ImagePart | AudioPart | VideoPart, Field(discriminator="type")]


class ToolCall(BaseModel):
    """A function call in an assistant's message: its id, the function's name and its arguments
    (JSON text, as the model wrote them)."""

    id: str
    name: str
    arguments: str


class ChatMessage(BaseModel):
    """One message of a conversation: an assistant's may hold tool calls, a tool's answers one
    (`tool_call_id`)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: list[Part]
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        """The message's text parts, joined by spaces."""
        return " ".join(p.text for p in self.content if isinstance(p, TextPart))


class Sampling(BaseModel):
    """How an LLM samples a reply: what a chat request asks and an LLM's input carries. Unset
    (None) fields take the checkpoint's generation config, as vLLM does: its temperature, top_p,
    top_k, min_p and repetition penalty when it samples, greedy when it does not; `max_tokens`
    unset: its `max_new_tokens`, else up to the context limit."""

    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: list[str] = Field(default_factory=list, max_length=16)
    seed: int | None = None
    # Log-probabilities of the chosen tokens, with this many alternatives each (None: none at all).
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # The reply is JSON that follows this JSON Schema: a grammar (llguidance, on either engine)
    # allows only the tokens that keep it so, JSON's optional whitespace left out.
    json_schema: dict[str, Any] | None = None

    def sampling(self) -> dict[str, Any]:
        """These fields as keyword arguments (to pass them on to another `Sampling`)."""
        return {name: getattr(self, name) for name in Sampling.model_fields}


class ChatRequest(Sampling):
    """A multimodal chat request: messages with text, images, audio and video; text and/or audio out;
    sampled as `Sampling` says."""

    model_config = _BASE64

    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Modality] = Field(default_factory=_text_only, min_length=1)
    # The speaker of audio answers (a name the model knows); None: the app's or the model's default.
    voice: str | None = Field(default=None, min_length=1, max_length=64)
    # Functions the model may call, as chat templates take them (`{"type": "function", "function": …}`).
    tools: list[dict[str, Any]] = Field(default_factory=list)
    # Each video's soundtrack goes in too, interleaved with its frames as the model's processor lays
    # them out (vLLM's `mm_processor_kwargs.use_audio_in_video`; the Qwen-Omni families).
    use_audio_in_video: bool = False

    @classmethod
    def of(
        cls,
        text: str,
        images: Sequence[bytes] = (),
        audios: Sequence[bytes] = (),
        audio_out: bool = False,
        videos: Sequence[bytes] = (),
        **fields: Any,
    ) -> ChatRequest:
        """A one-message user request: text, then images, audio clips and videos."""
        content: list[Part] = [TextPart(text=text)]
        content += [ImagePart(data=d) for d in images]
        content += [AudioPart(data=d) for d in audios]
        content += [VideoPart(data=d) for d in videos]
        modalities: list[Modality] = ["text", "audio"] if audio_out else ["text"]
        return cls(messages=[ChatMessage(role="user", content=content)], modalities=modalities, **fields)

    @property
    def prompt(self) -> str:
        """The conversation's text, one `role: text` line per message."""
        return "\n".join(f"{m.role}: {m.text}" for m in self.messages)

    @property
    def images(self) -> list[ImagePart]:
        """Every image of the conversation, in order."""
        return [p for m in self.messages for p in m.content if isinstance(p, ImagePart)]

    @property
    def audios(self) -> list[AudioPart]:
        """Every audio clip of the conversation, in order."""
        return [p for m in self.messages for p in m.content if isinstance(p, AudioPart)]

    @property
    def videos(self) -> list[VideoPart]:
        """Every video clip of the conversation, in order."""
        return [p for m in self.messages for p in m.content if isinstance(p, VideoPart)]

    @property
    def wants_audio(self) -> bool:
        """True when audio output is asked for."""
        return "audio" in self.modalities

    @property
    def request_type(self) -> str:
        """The request's type for plans and metrics: input modalities joined by '+', then '->audio'
        when speech is asked for (`text`, `image+text`, `audio+image+text+video->audio`)."""
        kinds = {"text"} | {p.type for m in self.messages for p in m.content}
        if self.use_audio_in_video and "video" in kinds:
            kinds.add("audio")
        name = "+".join(sorted(kinds))
        return f"{name}->audio" if self.wants_audio else name


FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token's log-probability, with the most likely alternatives at its step (`top`, for a chosen
    token only)."""

    token: str
    logprob: float
    bytes: list[int]
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of an LLM's streamed reply: its text, the tokens it covers and their log-probabilities
    (when asked for). The last piece says why generation ended and how long the prompt was (tokens
    the engine saw, media included)."""

    text: str = ""
    tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None


class ChatChunk(BaseModel):
    """A piece of a streamed answer: a text delta, or audio (16-bit mono PCM at `sample_rate`).

    What an engine reports travels with it: `tokens` the text covers (None: not counted, one per
    text chunk is assumed), their `logprobs`, and on the last text chunk `finish_reason` and
    `prompt_tokens`."""

    model_config = _BASE64

    text: str | None = None
    audio: bytes | None = None
    sample_rate: int = 24000
    tokens: int | None = None
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None

    @classmethod
    def of(cls, delta: TextDelta) -> ChatChunk:
        """The chat chunk of an LLM's text delta."""
        return cls(
            text=delta.text or None,
            tokens=delta.tokens,
            logprobs=list(delta.logprobs) if delta.logprobs is not None else None,
            finish_reason=delta.finish_reason,
            prompt_tokens=delta.prompt_tokens,
        )


class ChatCompletion(BaseModel):
    """A whole answer: text, and audio (16-bit mono PCM) when asked for; token counts and the finish
    reason when the app knows them (as in `ChatChunk`)."""

    model_config = _BASE64

    text: str
    audio: bytes | None = None
    sample_rate: int = 24000
    tokens: int | None = None
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
