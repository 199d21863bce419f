"""The built-in apps' settings: what each app module's one `SETTINGS` statement holds (the checkpoint,
the task's own fields, the engine and GPU settings), validated where the app is made."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from prismserve.app.settings import AppSettings
from prismserve.tasklib.units import Dtype, MediaModality


class ChatAppSettings(AppSettings):
    """What every built-in chat app takes: the checkpoint `model` (a local path or hub id, which
    `GET /v1/models` reports), the engine of its LLM stage with its `vllm` settings, and `gpus` per
    replica by component (`{"llm": 0.5}`; on vLLM `{"llm": 2}` is tensor parallelism), `dtype`
    every component's weights' dtype (`auto`: the checkpoint's, on either engine); with
    `prefill_decode` (vLLM) the LLM stage is a prefill and a decode deployment (`MLLMTask`, `OmniTask`);
    each encoder replica keeps `encoder_cache_mib` of recent media outputs (a conversation's earlier
    images and clips are not encoded again; 0: none)."""

    model: str = Field(min_length=1)
    engine: Literal["transformers", "vllm"] = "transformers"
    vllm: dict[str, Any] = Field(default_factory=dict)
    dtype: Dtype = "auto"
    gpus: dict[str, float] = Field(default_factory=dict)
    prefill_decode: bool = False
    encoder_cache_mib: int = Field(default=256, ge=0)


class MLLMAppSettings(ChatAppSettings):
    """`prismserve.apps.mllm`: a multimodal LLM with an encoder per media modality in `modalities`
    (what the app takes besides text), counting an image's tokens as its processor does
    (`image_tokens`: `patches` for Qwen-VL, `tiles` for InternVL, `fixed` for Gemma 3; see `MediaTokens`)."""

    modalities: tuple[MediaModality, ...] = ("image",)
    image_tokens: Literal["patches", "tiles", "fixed"] = "patches"


class OmniAppSettings(ChatAppSettings):
    """`prismserve.apps.omni`: an Omni model, split into encoders, thinker, talker and vocoder unless
    `monolith` (transformers' own `generate`, the paper's baseline), speaking up to `max_codes` codec
    ids per answer, taking the media in `modalities` (the families' default apps take video too, on
    transformers: clips go to an encoder deployment of the vision tower, and a request's
    `mm_processor_kwargs.use_audio_in_video` sends their soundtracks to the audio encoder)."""

    monolith: bool = False
    max_codes: int = Field(default=600, ge=1)
    modalities: tuple[MediaModality, ...] = ("image", "audio")


class ImageAppSettings(AppSettings):
    """`prismserve.apps.image`: a diffusers text-to-image checkpoint `model`, its text encoder
    fissioned from the generator, with `gpus` per replica by component (`{"generator": 0.7}`) and
    the weights in `dtype`."""

    model: str = Field(min_length=1)
    dtype: Dtype = "auto"
    gpus: dict[str, float] = Field(default_factory=dict)
