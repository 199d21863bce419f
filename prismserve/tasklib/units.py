"""Unit tasks of real models: a multimodal encoder and an LLM, each its own deployment.

Each names the executor that runs it for real (`executor_class`); `model` is a checkpoint directory or
hub id, whose family adapter (`prismserve.models`) knows where the checkpoint splits.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from prismserve.task import DataHandle, Stream, TaskInput, TaskOutput, UnitTask

MediaModality = Literal["image", "audio", "video"]


class MediaItem(TaskInput):
    """One encoded media item (image, audio clip, video clip) as its bytes."""

    modality: MediaModality
    data: bytes


class EncoderOutput(TaskOutput):
    """Embeddings `[tokens, hidden]` (a numpy array) and what the LLM needs to place them."""

    embeddings: DataHandle[Any]
    meta: DataHandle[dict[str, Any]]


class EncoderTask(UnitTask[MediaItem, EncoderOutput]):
    """The multimodal encoder of `model` for one modality; concurrent calls are batched."""

    executor_kind = "mm-encoder"
    executor_class = "prismserve.executors.encoder:EncoderExecutor"
    model: str
    modality: MediaModality
    max_batch: int = Field(default=8, ge=1)


class EncodedMedia(TaskInput):
    """An encoder's output for one media item, as the LLM receives it."""

    modality: MediaModality
    embeddings: DataHandle[Any]
    meta: DataHandle[dict[str, Any]]


class LLMInput(TaskInput):
    """A conversation in chat-template form, its media parts as `{"type": modality}` placeholders,
    with the media either precomputed by encoders (`encoded`) or raw (`media`), in order."""

    conversation: list[dict[str, Any]] = Field(min_length=1)
    encoded: list[EncodedMedia] = Field(default_factory=list)
    media: list[MediaItem] = Field(default_factory=list)
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    seed: int | None = None


class LLMTask(UnitTask[LLMInput, Stream[str]]):
    """The LLM of `model`, streaming text. With `with_encoders` it also holds the encoders and takes
    raw media: the whole model in one deployment (the monolith)."""

    executor_kind = "mm-llm"
    executor_class = "prismserve.executors.hf_llm:HFLLMExecutor"
    model: str
    with_encoders: bool = False
