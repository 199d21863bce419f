"""Unit tasks of real models: a multimodal encoder and an LLM, each its own deployment.

Each is a component's settings and types (`prismserve.task.components`) with the executor that runs
it for real (`executor_ref`); `model` is a checkpoint directory or hub id, whose family adapter
(`prismserve.models`) knows where the checkpoint splits. The components' inputs, outputs and
settings are importable from here too.
"""

from __future__ import annotations

from typing import Any

from prismserve.protocol.chat import TextDelta
from prismserve.task import ExecutorRef, Stream, UnitTask
from prismserve.task.components import (
    DecodeInput,
    Dtype,
    EncodedMedia,
    EncoderOutput,
    EncoderSettings,
    Handoff,
    ImageGeneratorSettings,
    ImageGenInput,
    ImageOutput,
    LLMInput,
    LLMSettings,
    MediaItem,
    MediaModality,
    ModelSettings,
    OmniMonolithSettings,
    PromptEmbeddings,
    PromptInput,
    SpeechOutput,
    TalkerInput,
    ThinkerOutput,
    VLLMEngineSettings,
    VLLMHandoffSettings,
    VocoderInput,
)
from prismserve.tasklib.media_tokens import MediaTokens

__all__ = [
    "DEFAULT_COUNTING",
    "ONE_DEVICE",
    "CountsMedia",
    "DecodeInput",
    "Dtype",
    "EncodedMedia",
    "EncoderOutput",
    "EncoderSettings",
    "EncoderTask",
    "Handoff",
    "ImageGenInput",
    "ImageGeneratorSettings",
    "ImageGeneratorTask",
    "ImageOutput",
    "LLMInput",
    "LLMSettings",
    "LLMTask",
    "MediaItem",
    "MediaModality",
    "ModelSettings",
    "OmniMonolithSettings",
    "OmniMonolithTask",
    "PromptEmbeddings",
    "PromptInput",
    "SpeechOutput",
    "TalkerInput",
    "TalkerTask",
    "TextEncoderTask",
    "ThinkerOutput",
    "ThinkerTask",
    "VLLMDecodeTask",
    "VLLMEngineSettings",
    "VLLMHandoffSettings",
    "VLLMPrefillTask",
    "VLLMTask",
    "VLLMThinkerDecodeTask",
    "VLLMThinkerPrefillTask",
    "VLLMThinkerTask",
    "VocoderInput",
    "VocoderTask",
]

# transformers and diffusers run a replica's model on one device: a share of a GPU or one whole GPU.
ONE_DEVICE = 1

# How an item not counted when its request arrived is counted: the default rule (Qwen-VL's).
DEFAULT_COUNTING = MediaTokens()


class CountsMedia:
    """Unit tasks whose input holds raw media (a `MediaItem`, an `LLMInput`): items not counted
    when their request arrived are counted by the default rule when the dispatcher asks."""

    def pending_tokens(self, task_input: Any) -> int:
        """The input's tokens, uncounted media counted by `DEFAULT_COUNTING`."""
        return int(task_input.pending_tokens(DEFAULT_COUNTING.count))


class EncoderTask(CountsMedia, UnitTask[MediaItem, EncoderOutput], EncoderSettings):
    """The multimodal encoder of `model` for one modality; concurrent calls are batched."""

    executor_kind = "mm-encoder"
    executor_ref = ExecutorRef("prismserve.executors.encoder:EncoderExecutor")
    max_gpus = ONE_DEVICE


class LLMTask(CountsMedia, UnitTask[LLMInput, Stream[TextDelta]], LLMSettings):
    """The LLM of `model`, streaming text. With `with_encoders` it also holds the encoders and takes
    raw media: the whole model in one deployment (the monolith)."""

    executor_kind = "mm-llm"
    executor_ref = ExecutorRef("prismserve.executors.hf_llm:HFLLMExecutor")
    max_gpus = ONE_DEVICE


class VLLMTask(CountsMedia, UnitTask[LLMInput, Stream[TextDelta]], VLLMEngineSettings):
    """The LLM of `model` on vLLM's async engine (continuous batching), streaming text; with
    `with_encoders` vLLM runs the model's own encoders on raw media (the monolith)."""

    executor_kind = "mm-llm-vllm"
    executor_ref = ExecutorRef("prismserve.executors.vllm_llm:VLLMExecutor", env="vllm")


class VLLMPrefillTask(CountsMedia, UnitTask[LLMInput, Handoff], VLLMHandoffSettings):
    """The prefill side of `model`'s LLM split into prefill and decode (TriInfer's P): computes the
    prompt (its KV cache goes to decode through vLLM's KV connector) and the first token."""

    executor_kind = "mm-llm-prefill"
    executor_ref = ExecutorRef("prismserve.executors.vllm_llm:VLLMPrefillExecutor", env="vllm")


class VLLMDecodeTask(CountsMedia, UnitTask[DecodeInput, Stream[TextDelta]], VLLMHandoffSettings):
    """The decode side of `model`'s LLM split into prefill and decode (TriInfer's D): streams the
    reply from prefill's first token on, with the KV cache prefill handed over."""

    executor_kind = "mm-llm-decode"
    executor_ref = ExecutorRef("prismserve.executors.vllm_llm:VLLMDecodeExecutor", env="vllm")


class ThinkerTask(CountsMedia, UnitTask[LLMInput, ThinkerOutput], LLMSettings):
    """An Omni model's thinker LLM (`LLMTask` plus what the talker needs from it)."""

    executor_kind = "mm-thinker"
    executor_ref = ExecutorRef("prismserve.executors.hf_llm:ThinkerExecutor")
    max_gpus = ONE_DEVICE


class VLLMThinkerTask(CountsMedia, UnitTask[LLMInput, ThinkerOutput], VLLMEngineSettings):
    """An Omni model's thinker on vLLM's async engine (Qwen2.5-Omni, Qwen3-Omni): `ThinkerTask`'s output
    (text, then the talker's conditioning) from vLLM's continuous batching, the hidden states taken
    out of the engine as it generates.

    vLLM 0.32 takes precomputed image embeddings but audio only raw (it runs the audio tower itself):
    without `with_encoders` images arrive as embeddings and audio arrives raw, so this deployment
    keeps the audio tower (`OmniTask(engine="vllm")` fissions the image encoder only).
    """

    executor_kind = "mm-thinker-vllm"
    executor_ref = ExecutorRef("prismserve.executors.vllm_thinker:VLLMThinkerExecutor", env="vllm")


class VLLMThinkerPrefillTask(CountsMedia, UnitTask[LLMInput, Handoff], VLLMHandoffSettings):
    """The prefill side of an Omni thinker split into prefill and decode (TriInfer's P): computes the
    prompt (its KV cache, the captured layer's with it, goes to decode) and the first token."""

    executor_kind = "mm-thinker-prefill"
    executor_ref = ExecutorRef("prismserve.executors.vllm_thinker:VLLMThinkerPrefillExecutor", env="vllm")


class VLLMThinkerDecodeTask(CountsMedia, UnitTask[DecodeInput, ThinkerOutput], VLLMHandoffSettings):
    """The decode side of an Omni thinker split into prefill and decode (TriInfer's D): `VLLMThinkerTask`'s
    output from prefill's first token on, the talker's conditioning read from this engine alone."""

    executor_kind = "mm-thinker-decode"
    executor_ref = ExecutorRef("prismserve.executors.vllm_thinker:VLLMThinkerDecodeExecutor", env="vllm")


class TalkerTask(UnitTask[TalkerInput, Stream[list[Any]]], ModelSettings):
    """An Omni model's talker: thinker states in, codes streamed out in chunks — codec ids
    (Qwen2.5-Omni) or frames of one id per codebook (Qwen3-Omni)."""

    executor_kind = "mm-talker"
    executor_ref = ExecutorRef("prismserve.executors.speech:TalkerExecutor")
    max_gpus = ONE_DEVICE


class VocoderTask(UnitTask[VocoderInput, Stream[bytes]], ModelSettings):
    """Codes to audio (token2wav / code2wav), streamed as 16-bit mono PCM chunks."""

    executor_kind = "mm-vocoder"
    executor_ref = ExecutorRef("prismserve.executors.speech:VocoderExecutor")
    max_gpus = ONE_DEVICE


class OmniMonolithTask(CountsMedia, UnitTask[LLMInput, SpeechOutput], OmniMonolithSettings):
    """A whole Omni model in one deployment, run by transformers' own `generate` (the baseline)."""

    executor_kind = "mm-omni"
    executor_ref = ExecutorRef("prismserve.executors.speech:OmniMonolithExecutor")
    max_gpus = ONE_DEVICE


class TextEncoderTask(UnitTask[PromptInput, PromptEmbeddings], ModelSettings):
    """An image model's text encoder (Qwen-Image: a Qwen2.5-VL LLM's last hidden states)."""

    executor_kind = "mm-text-encoder"
    executor_ref = ExecutorRef("prismserve.executors.image:TextEncoderExecutor")
    max_gpus = ONE_DEVICE


class ImageGeneratorTask(UnitTask[ImageGenInput, ImageOutput], ImageGeneratorSettings):
    """An image model's generator (DiT + VAE). With `with_text_encoder` it takes the prompt itself:
    the whole pipeline in one deployment (the monolith)."""

    executor_kind = "mm-image"
    executor_ref = ExecutorRef("prismserve.executors.image:ImageGeneratorExecutor")
    max_gpus = ONE_DEVICE
