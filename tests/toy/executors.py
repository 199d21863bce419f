"""Fake executors for the toy tasks: deterministic, instant, and checkable by tests."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

from prismserve.task import DataHandle
from toy.tasks import (
    EncoderOutput,
    EncoderTask,
    LLMInput,
    LLMTask,
    MediaInput,
    TalkerInput,
    TalkerOutput,
    TalkerTask,
    VocoderInput,
    VocoderTask,
)

EMBEDDING_DIM = 4


def embed(item: MediaInput) -> list[float]:
    """The toy embedding of a media item: a few numbers derived from its bytes."""
    digest = hashlib.sha256(item.modality.encode() + item.data).digest()
    return [b / 255 for b in digest[:EMBEDDING_DIM]]


async def encoder(task: EncoderTask, item: MediaInput) -> EncoderOutput:
    """Encode one item."""
    if item.modality != task.modality:
        raise ValueError(f"{task.modality} encoder got a {item.modality} item")
    return EncoderOutput(embedding=DataHandle.wrap(embed(item)))


async def llm(task: LLMTask, request: LLMInput) -> AsyncIterator[str]:
    """Stream tokens that say what the LLM received: media count, embedding checksum, the prompt."""
    if request.media and not task.with_encoders:
        raise ValueError("this LLM deployment has no encoders: send embeddings, not raw media")
    embeddings = [handle.value for handle in request.embeddings] + [embed(m) for m in request.media]
    checksum = sum(sum(e) for e in embeddings)
    tokens = [f"[{len(embeddings)} media, {checksum:.3f}]", *request.prompt.split()]
    for token in tokens[: request.max_tokens]:
        yield token


async def talker(task: TalkerTask, request: TalkerInput) -> TalkerOutput:
    """One speech code per word of the text."""
    return TalkerOutput(codes=DataHandle.wrap([len(word) for word in await request.text.collect()]))


async def vocoder(task: VocoderTask, request: VocoderInput) -> AsyncIterator[bytes]:
    """One audio chunk per code."""
    for code in request.codes.value:
        yield bytes([code % 256]) * 4


EXECUTORS: dict[str, Any] = {"encoder": encoder, "llm": llm, "talker": talker, "vocoder": vocoder}
"""Toy executors by executor kind, for a LocalDispatcher."""

VALUES: dict[type, Any] = {EncoderTask: encoder, LLMTask: llm, TalkerTask: talker, VocoderTask: vocoder}
"""Toy executors by task class, the value functions of `sim` executors serving toy tasks."""
