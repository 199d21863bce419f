"""The chat wire types: what OpenAI-compatible apps take and return.

An app whose serve() takes a `ChatRequest` and returns a `ChatCompletion` (or streams `ChatChunk`s)
can be called through `/v1/chat/completions`; the gateway translates the OpenAI format to these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prismserve.task import TaskInput

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


class ChatMessage(BaseModel):
    """One message of a conversation."""

    role: Literal["system", "user", "assistant"]
    content: list[Part]

    @property
    def text(self) -> str:
        """The message's text parts, joined by spaces."""
        return " ".join(p.text for p in self.content if isinstance(p, TextPart))


class ChatRequest(TaskInput):
    """A multimodal chat request: messages with text, images, audio and video; text and/or audio out."""

    model_config = _BASE64

    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Modality] = Field(default_factory=_text_only, min_length=1)
    max_tokens: int = Field(default=256, ge=1, le=32768)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    seed: int | None = None
    # The speaker of audio answers (a name the model knows); None: the app's or the model's default.
    voice: str | None = Field(default=None, min_length=1, max_length=64)

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
        name = "+".join(sorted(kinds))
        return f"{name}->audio" if self.wants_audio else name


class ChatChunk(BaseModel):
    """A piece of a streamed answer: a text delta, or audio (16-bit mono PCM at `sample_rate`)."""

    model_config = _BASE64

    text: str | None = None
    audio: bytes | None = None
    sample_rate: int = 24000


class ChatCompletion(BaseModel):
    """A whole answer: text, and audio (16-bit mono PCM) when asked for."""

    model_config = _BASE64

    text: str
    audio: bytes | None = None
    sample_rate: int = 24000
