"""Toy unit tasks and the MLLM / Omni composites built from them (shaped like 000 Listing 1)."""

from __future__ import annotations

from pydantic import Field

from prismserve.protocol.chat import ChatRequest
from prismserve.task import DataHandle, Stream, Task, TaskInput, TaskOutput, UnitTask


class MediaInput(TaskInput):
    """One image or audio clip to encode."""

    modality: str
    data: bytes


class EncoderOutput(TaskOutput):
    """Embedding of one media item."""

    embedding: DataHandle[list[float]]


class EncoderTask(UnitTask[MediaInput, EncoderOutput]):
    """A multimodal encoder for one modality."""

    executor_kind = "encoder"
    model_id: str
    modality: str


class LLMInput(TaskInput):
    """Prompt plus either precomputed embeddings (fissioned) or raw media (monolith)."""

    prompt: str
    embeddings: list[DataHandle[list[float]]] = Field(default_factory=list)
    media: list[MediaInput] = Field(default_factory=list)
    max_tokens: int | None = None  # None: the whole answer


class LLMTask(UnitTask[LLMInput, Stream[str]]):
    """The LLM; with `with_encoders` it also encodes raw media itself (colocated, monolithic)."""

    executor_kind = "llm"
    model_id: str
    with_encoders: bool = False


class TalkerInput(TaskInput):
    """The text the talker speaks, streamed from the LLM."""

    text: Stream[str]


class TalkerOutput(TaskOutput):
    """Speech codes."""

    codes: DataHandle[list[int]]


class TalkerTask(UnitTask[TalkerInput, TalkerOutput]):
    """Turns text into speech codes."""

    executor_kind = "talker"
    model_id: str


class VocoderInput(TaskInput):
    """Speech codes to turn into audio."""

    codes: DataHandle[list[int]]


class VocoderTask(UnitTask[VocoderInput, Stream[bytes]]):
    """Turns speech codes into audio chunks, streamed."""

    executor_kind = "vocoder"
    model_id: str


class ChatOutput(TaskOutput):
    """Streamed text, and streamed audio when asked for."""

    text: Stream[str]
    audio: Stream[bytes] | None = None


class MLLMTask(Task[ChatRequest, ChatOutput]):
    """Encoders + LLM. With `encoder_fission` each media item goes to its own encoder call.

    `encoder_model_id` lets several LLMs use one encoder checkpoint, and so one encoder deployment.
    """

    model_id: str
    encoder_model_id: str | None = None
    encoder_fission: bool = True

    def post_init(self) -> None:
        if self.encoder_fission:
            encoder_id = self.encoder_model_id or self.model_id
            self.encoders = {m: EncoderTask(model_id=encoder_id, modality=m) for m in ("image", "audio")}
        self.llm = LLMTask(model_id=self.model_id, with_encoders=not self.encoder_fission)

    def invoke(self, request: ChatRequest) -> ChatOutput:
        media = [MediaInput(modality="image", data=p.data) for p in request.images]
        media += [MediaInput(modality="audio", data=p.data) for p in request.audios]
        if self.encoder_fission:
            embeddings = [self.encoders[item.modality].invoke(item).embedding for item in media]
            llm_input = LLMInput(prompt=request.prompt, embeddings=embeddings, max_tokens=request.max_tokens)
        else:
            llm_input = LLMInput(prompt=request.prompt, media=media, max_tokens=request.max_tokens)
        return ChatOutput(text=self.llm.invoke(llm_input))


class OmniTask(Task[ChatRequest, ChatOutput]):
    """Thinker (an MLLMTask) plus a talker and vocoder that run only when audio output is asked for."""

    model_id: str
    encoder_fission: bool = True

    def post_init(self) -> None:
        self.thinker = MLLMTask(model_id=self.model_id, encoder_fission=self.encoder_fission)
        self.talker = TalkerTask(model_id=self.model_id)
        self.vocoder = VocoderTask(model_id=self.model_id)

    def invoke(self, request: ChatRequest) -> ChatOutput:
        text = self.thinker.invoke(request).text
        if not request.wants_audio:
            return ChatOutput(text=text)
        codes = self.talker.invoke(TalkerInput(text=text)).codes
        return ChatOutput(text=text, audio=self.vocoder.invoke(VocoderInput(codes=codes)))
