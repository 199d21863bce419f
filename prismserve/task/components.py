"""The contract of the built-in model components: what each takes, what it gives, and the settings
its executor reads from its unit task.

The task library's unit tasks (`prismserve.tasklib.units`) are these settings with their types
(`class EncoderTask(UnitTask[MediaItem, EncoderOutput], EncoderSettings)`); the executors
(`prismserve.executors`) are generic over the same settings and types. Both sides import this
module, never each other, so the task library and the engines can change apart.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from prismserve.protocol.chat import FinishReason, Sampling, TextDelta
from prismserve.task.base import TaskInput, TaskOutput
from prismserve.task.data import DataHandle, Stream
from prismserve.task.descriptor import ExecutorSettings
from prismserve.task.errors import InvalidInputError

MediaModality = Literal["image", "audio", "video"]

# Tokens a media item of a modality becomes, from its bytes: a model's processor rule (the task
# library's `MediaTokens.count`), for items not counted when the request arrived.
MediaCounter = Callable[[str, bytes], int]

# Characters per text token, to estimate a prompt's tokens without its tokenizer (English BPE: ~4).
CHARS_PER_TOKEN = 4


class MediaItem(TaskInput):
    """One encoded media item (image, audio clip, video clip) as its bytes, and the tokens the
    model's processor makes of it (`tokens`; 0: not counted yet)."""

    modality: MediaModality
    data: bytes
    tokens: int = Field(default=0, ge=0)

    def pending_tokens(self, count: MediaCounter | None = None) -> int:
        """The item's tokens; an uncounted one is counted by `count` (1 without a rule: the task
        layer knows no model's processor, `EncoderTask.pending_tokens` passes its rule)."""
        if self.tokens:
            return self.tokens
        return count(self.modality, self.data) if count is not None else 1


class EncoderOutput(TaskOutput):
    """Embeddings `[tokens, hidden]` (a numpy array) and what the LLM needs to place them."""

    embeddings: DataHandle[Any]
    meta: DataHandle[dict[str, Any]]


class EncodedMedia(TaskInput):
    """An encoder's output for one media item, as the LLM receives it."""

    modality: MediaModality
    embeddings: DataHandle[Any]
    meta: DataHandle[dict[str, Any]]
    tokens: int = Field(default=0, ge=0)  # counted from the item before encoding (MediaItem.tokens)


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
    # Functions the chat template shows the model (`ChatRequest.tools`).
    tools: list[dict[str, Any]] = Field(default_factory=list)

    def pending_tokens(self, count: MediaCounter | None = None) -> int:
        """The prompt's tokens: its text (estimated from its length) and its media, encoded or raw
        (a decoder-only LLM attends to both alike; uncounted raw items counted by `count`)."""
        chars = sum(
            len(part.get("text") or "") for m in self.conversation for part in _parts(m.get("content"))
        )
        media = sum(e.tokens for e in self.encoded) + sum(m.pending_tokens(count) for m in self.media)
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


class Handoff(TaskOutput):
    """What a prefill deployment hands its decode deployment beside the KV cache (which vLLM's KV
    connector carries): the first token, which prefill computed, and what decode needs to go on
    from it as if one engine had run the whole request."""

    token: int
    # The token's log-probability and the most likely tokens' (`ReplyText.push`'s form), when asked for.
    logprobs: tuple[float, list[tuple[int, float]]] | None = None
    finish_reason: FinishReason | None = None  # set when the first token ended the reply
    prompt_tokens: int = Field(ge=0)  # the prompt as the engine counted it (media tokens included)


class DecodeInput(LLMInput):
    """A request to decode: the same conversation and media its prefill got, and prefill's `handoff`."""

    handoff: Handoff


class ThinkerOutput(TaskOutput):
    """A thinker's streamed text and, when speech is asked for, one item: the talker's conditioning."""

    text: Stream[TextDelta]
    talker: Stream[Any]


class TalkerInput(TaskInput):
    """The thinker's conditioning stream, and how many codec ids at most to generate."""

    thinker: Stream[Any]
    max_codes: int = Field(default=600, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)


class VocoderInput(TaskInput):
    """Codes (streamed in chunks, as the talker makes them) to turn into audio, the voice, and the
    seed of the vocoder's noise (Qwen2.5-Omni's token2wav; Qwen3-Omni's code2wav has none)."""

    codes: Stream[list[Any]]
    speaker: str | None = None
    seed: int = 0


class SpeechOutput(TaskOutput):
    """Streamed text and 16-bit mono PCM audio (empty when speech was not asked for)."""

    text: Stream[TextDelta]
    audio: Stream[bytes]


class PromptInput(TaskInput):
    """A text prompt to condition an image generator on."""

    prompt: str


class PromptEmbeddings(TaskOutput):
    """The prompt's conditioning `[tokens, hidden]` (a numpy array)."""

    embeds: DataHandle[Any]


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


# The weights' dtypes a component may ask for: `auto` is the checkpoint's own (`checkpoint_dtype`).
Dtype = Literal["auto", "bfloat16", "float16", "float32"]


class ModelSettings(ExecutorSettings):
    """A component of checkpoint `model` (a directory or hub id), whose family adapter
    (`prismserve.models`) knows where the checkpoint splits: what every real-model executor reads.
    `dtype`: its weights' dtype on either engine; `auto` is the checkpoint's own, so that the
    components of one app compute alike whichever engine runs each."""

    model_config = ConfigDict(frozen=True)

    model: str
    dtype: Dtype = "auto"


class EncoderSettings(ModelSettings):
    """A multimodal encoder of one modality, batching at most `max_batch` concurrent items and
    keeping the outputs of recent items, up to `cache_mib` per replica (0: none), by their content:
    a conversation's earlier images and clips are not encoded again on its next turns."""

    modality: MediaModality
    max_batch: int = Field(default=8, ge=1)
    cache_mib: int = Field(default=256, ge=0)


class LLMSettings(ModelSettings):
    """An LLM (or an Omni thinker); `with_encoders`: it also holds the encoders and takes raw media."""

    with_encoders: bool = False

    def context_length(self) -> int | None:
        """The tokens it attends to, prompt and reply together: its checkpoint's text config says
        (`max_position_embeddings`; None when it does not, or cannot be read here)."""
        return checkpoint_context_length(self.model)


class VLLMEngineSettings(LLMSettings):
    """How a unit task's vLLM engine runs `model` (the fields every vLLM-run task shares).

    Its replicas run in the vLLM environment (`prismserve vllm-env`). `kv_cache_gib` sizes the KV
    cache on a CPU; `engine_args` go to vLLM's `AsyncEngineArgs` as they are. `token_budget`: the most
    tokens one engine step computes (TriInfer's token budget, from `prismserve profile`; vLLM's
    `max_num_batched_tokens` with chunked prefill), None: vLLM's default. `quantization`: vLLM's
    method for the weights (`--quantization`); None: what the checkpoint's `quantization_config`
    says (vLLM reads it), else none.
    """

    max_model_len: int = Field(default=4096, ge=16)
    kv_cache_gib: int = Field(default=1, ge=1)
    quantization: str | None = Field(default=None, min_length=1)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    token_budget: int | None = Field(default=None, ge=1)

    def context_length(self) -> int | None:
        """vLLM's `max_model_len` (the engine's own argument, when `engine_args` sets it)."""
        return int(self.engine_args.get("max_model_len", self.max_model_len))


class VLLMHandoffSettings(VLLMEngineSettings):
    """A vLLM engine of a prefill or decode deployment: the two hand the KV cache over through
    `handoff_dir`, a directory both reach (one node's file system; shared storage across nodes),
    where a hand-off waits `handoff_ttl_s` at most for its decode, and is deleted `handoff_grace_s`
    after its decode took it."""

    handoff_dir: str = Field(min_length=1)
    handoff_ttl_s: float = Field(default=300.0, gt=0)
    handoff_grace_s: float = Field(default=5.0, gt=0)


class OmniMonolithSettings(ModelSettings):
    """A whole Omni model in one deployment, speaking at most `max_codes` codec ids a reply."""

    max_codes: int = Field(default=600, ge=1)


class ImageGeneratorSettings(ModelSettings):
    """An image generator (DiT + VAE); `with_text_encoder`: it also holds the text encoder and takes
    the prompt itself."""

    with_text_encoder: bool = False


@functools.cache
def checkpoint_config(model: str, name: str = "config.json") -> dict[str, Any]:
    """Checkpoint `model`'s `config.json` (or its JSON file `name`): a local directory's, or the hub
    cache's (no download, no transformers import: gateways read it too); {} when it is not there."""
    local = Path(model) / name
    if local.is_file():
        path: Any = local
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(model, name)
        except (ImportError, ValueError):  # no hub client; not a hub id (HFValidationError)
            return {}
    if not isinstance(path, (str, Path)):
        return {}
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def checkpoint_dtype(model: str) -> str:
    """The dtype checkpoint `model` was saved in (its config's `dtype`), what `auto` means here on
    every engine and component; vLLM's own `auto` differs (vLLM-CPU runs a float32 checkpoint in
    bfloat16, vLLM on CUDA in float16), so that its replies would differ from the transformers
    engine's and from the float32 encoders and talker beside it. `auto` (the engine's) when the
    config does not say or is not there."""
    config = checkpoint_config(model)
    found = config.get("dtype") or config.get("torch_dtype")
    return found if isinstance(found, str) else "auto"


def checkpoint_context_length(model: str) -> int | None:
    """`max_position_embeddings` of checkpoint `model`'s text config; None if it has none or its
    config is not there (the engine then checks the context alone)."""
    config = checkpoint_config(model)
    # Where the families keep their LLM's config: a VLM's `text_config`, an Omni thinker's, InternVL's
    # `llm_config`, or the top level (older Qwen2.5-VL configs).
    for keys in (("text_config",), ("thinker_config", "text_config"), ("llm_config",), ()):
        node: Any = config
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        length = node.get("max_position_embeddings") if isinstance(node, dict) else None
        if isinstance(length, int):
            return length
    return None
