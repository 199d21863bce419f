"""Unit tasks of real models: a multimodal encoder and an LLM, each its own deployment.

Each names the executor that runs it for real (`executor_class`); `model` is a checkpoint directory or
hub id, whose family adapter (`prismserve.models`) knows where the checkpoint splits.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prismserve.protocol.chat import Sampling, TextDelta
from prismserve.task import DataHandle, InvalidInputError, Stream, TaskInput, TaskOutput, UnitTask
from prismserve.tasklib.media_tokens import MediaTokens

MediaModality = Literal["image", "audio", "video"]

# transformers and diffusers run a replica's model on one device: a share of a GPU or one whole GPU.
ONE_DEVICE = 1


class MediaItem(TaskInput):
    """One encoded media item (image, audio clip, video clip) as its bytes, and the tokens the
    model's processor makes of it (`tokens`; 0: count it by the default rule when asked)."""

    modality: MediaModality
    data: bytes
    tokens: int = Field(default=0, ge=0)

    def pending_tokens(self) -> int:
        return self.tokens or MediaTokens().count(self.modality, self.data)


class EncoderOutput(TaskOutput):
    """Embeddings `[tokens, hidden]` (a numpy array) and what the LLM needs to place them."""

    embeddings: DataHandle[Any]
    meta: DataHandle[dict[str, Any]]


class EncoderTask(UnitTask[MediaItem, EncoderOutput]):
    """The multimodal encoder of `model` for one modality; concurrent calls are batched."""

    executor_kind = "mm-encoder"
    executor_class = "prismserve.executors.encoder:EncoderExecutor"
    max_gpus = ONE_DEVICE
    model: str
    modality: MediaModality
    max_batch: int = Field(default=8, ge=1)


class EncodedMedia(TaskInput):
    """An encoder's output for one media item, as the LLM receives it."""

    modality: MediaModality
    embeddings: DataHandle[Any]
    meta: DataHandle[dict[str, Any]]
    tokens: int = Field(default=0, ge=0)  # counted from the item before encoding (MediaItem.tokens)


# Characters per text token, to estimate a prompt's tokens without its tokenizer (English BPE: ~4).
CHARS_PER_TOKEN = 4


class LLMInput(TaskInput, Sampling):
    """A conversation in chat-template form, its media parts as `{"type": modality}` placeholders,
    with the media either precomputed by encoders (`encoded`) or raw (`media`), in order; sampled
    as `Sampling` says (unset fields: the checkpoint's generation config)."""

    conversation: list[dict[str, Any]] = Field(min_length=1)
    encoded: list[EncodedMedia] = Field(default_factory=list)
    media: list[MediaItem] = Field(default_factory=list)
    # Speech asked for: a thinker also hands the talker its conditioning, a monolith also speaks.
    speech: bool = False
    speaker: str | None = None

    def pending_tokens(self) -> int:
        """The prompt's tokens: its text (estimated from its length) and its media, encoded or raw
        (a decoder-only LLM attends to both alike)."""
        chars = sum(
            len(part.get("text") or "") for m in self.conversation for part in _parts(m.get("content"))
        )
        media = sum(e.tokens for e in self.encoded) + sum(m.pending_tokens() for m in self.media)
        return max(1, chars // CHARS_PER_TOKEN) + media

    def check_media(self, takes_media: bool, model: str) -> None:
        """Raw media reach only a deployment that holds the encoders (else: the request's fault)."""
        if self.media and not takes_media:
            raise InvalidInputError(
                f"this deployment of {model} has no encoders: send embeddings, not raw media"
            )


def _parts(content: Any) -> list[dict[str, Any]]:
    """A chat-template message's content as a list of parts (a plain string is one text part)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [part for part in content or [] if isinstance(part, dict)]


class LLMTask(UnitTask[LLMInput, Stream[TextDelta]]):
    """The LLM of `model`, streaming text. With `with_encoders` it also holds the encoders and takes
    raw media: the whole model in one deployment (the monolith)."""

    executor_kind = "mm-llm"
    executor_class = "prismserve.executors.hf_llm:HFLLMExecutor"
    max_gpus = ONE_DEVICE
    model: str
    with_encoders: bool = False


class VLLMEngineSettings(BaseModel):
    """How a unit task's vLLM engine runs `model` (the fields every vLLM-run task shares).

    Its replicas run in the vLLM environment (`prismserve vllm-env`). `kv_cache_gib` sizes the KV
    cache on a CPU; `engine_args` go to vLLM's `AsyncEngineArgs` as they are.
    """

    model_config = ConfigDict(frozen=True)

    model: str
    with_encoders: bool = False
    dtype: str = "auto"
    max_model_len: int = Field(default=4096, ge=16)
    kv_cache_gib: int = Field(default=1, ge=1)
    engine_args: dict[str, Any] = Field(default_factory=dict)


class VLLMTask(UnitTask[LLMInput, Stream[TextDelta]], VLLMEngineSettings):
    """The LLM of `model` on vLLM's async engine (continuous batching), streaming text; with
    `with_encoders` vLLM runs the model's own encoders on raw media (the monolith)."""

    executor_kind = "mm-llm-vllm"
    executor_class = "prismserve.executors.vllm_llm:VLLMExecutor"
    executor_env = "vllm"


class ThinkerOutput(TaskOutput):
    """A thinker's streamed text and, when speech is asked for, one item: the talker's conditioning."""

    text: Stream[TextDelta]
    talker: Stream[Any]


class ThinkerTask(UnitTask[LLMInput, ThinkerOutput]):
    """An Omni model's thinker LLM (`LLMTask` plus what the talker needs from it)."""

    executor_kind = "mm-thinker"
    executor_class = "prismserve.executors.hf_llm:ThinkerExecutor"
    max_gpus = ONE_DEVICE
    model: str
    with_encoders: bool = False


class VLLMThinkerTask(UnitTask[LLMInput, ThinkerOutput], VLLMEngineSettings):
    """An Omni model's thinker on vLLM's async engine (Qwen2.5-Omni, Qwen3-Omni): `ThinkerTask`'s output
    (text, then the talker's conditioning) from vLLM's continuous batching, the hidden states taken
    out of the engine as it generates.

    vLLM 0.32 takes precomputed image embeddings but audio only raw (it runs the audio tower itself):
    without `with_encoders` images arrive as embeddings and audio arrives raw, so this deployment
    keeps the audio tower (`OmniTask(engine="vllm")` fissions the image encoder only).
    """

    executor_kind = "mm-thinker-vllm"
    executor_class = "prismserve.executors.vllm_thinker:VLLMThinkerExecutor"
    executor_env = "vllm"


class TalkerInput(TaskInput):
    """The thinker's conditioning stream, and how many codec ids at most to generate."""

    thinker: Stream[Any]
    max_codes: int = Field(default=600, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)


class TalkerTask(UnitTask[TalkerInput, Stream[list[Any]]]):
    """An Omni model's talker: thinker states in, codes streamed out in chunks — codec ids
    (Qwen2.5-Omni) or frames of one id per codebook (Qwen3-Omni)."""

    executor_kind = "mm-talker"
    executor_class = "prismserve.executors.speech:TalkerExecutor"
    max_gpus = ONE_DEVICE
    model: str


class VocoderInput(TaskInput):
    """Codes (streamed in chunks, as the talker makes them) to turn into audio, the voice, and the
    seed of the vocoder's noise (Qwen2.5-Omni's token2wav; Qwen3-Omni's code2wav has none)."""

    codes: Stream[list[Any]]
    speaker: str | None = None
    seed: int = 0


class VocoderTask(UnitTask[VocoderInput, Stream[bytes]]):
    """Codes to audio (token2wav / code2wav), streamed as 16-bit mono PCM chunks."""

    executor_kind = "mm-vocoder"
    executor_class = "prismserve.executors.speech:VocoderExecutor"
    max_gpus = ONE_DEVICE
    model: str


class SpeechOutput(TaskOutput):
    """Streamed text and 16-bit mono PCM audio (empty when speech was not asked for)."""

    text: Stream[TextDelta]
    audio: Stream[bytes]


class OmniMonolithTask(UnitTask[LLMInput, SpeechOutput]):
    """A whole Omni model in one deployment, run by transformers' own `generate` (the baseline)."""

    executor_kind = "mm-omni"
    executor_class = "prismserve.executors.speech:OmniMonolithExecutor"
    max_gpus = ONE_DEVICE
    model: str
    max_codes: int = Field(default=600, ge=1)


class PromptInput(TaskInput):
    """A text prompt to condition an image generator on."""

    prompt: str


class PromptEmbeddings(TaskOutput):
    """The prompt's conditioning `[tokens, hidden]` (a numpy array)."""

    embeds: DataHandle[Any]


class TextEncoderTask(UnitTask[PromptInput, PromptEmbeddings]):
    """An image model's text encoder (Qwen-Image: a Qwen2.5-VL LLM's last hidden states)."""

    executor_kind = "mm-text-encoder"
    executor_class = "prismserve.executors.image:TextEncoderExecutor"
    max_gpus = ONE_DEVICE
    model: str


class ImageGenInput(TaskInput):
    """One image to generate: from the prompt's conditioning (split) or the prompt itself (whole)."""

    embeds: DataHandle[Any] | None = None
    negative: DataHandle[Any] | None = None
    prompt: str | None = None
    negative_prompt: str | None = None
    width: int
    height: int
    steps: int
    guidance: float
    seed: int


class ImageOutput(TaskOutput):
    """A PNG image."""

    image: DataHandle[bytes]


class ImageGeneratorTask(UnitTask[ImageGenInput, ImageOutput]):
    """An image model's generator (DiT + VAE). With `with_text_encoder` it takes the prompt itself:
    the whole pipeline in one deployment (the monolith)."""

    executor_kind = "mm-image"
    executor_class = "prismserve.executors.image:ImageGeneratorExecutor"
    max_gpus = ONE_DEVICE
    model: str
    with_text_encoder: bool = False
