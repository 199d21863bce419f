"""prismserve's own model families, declared in the `prismserve.models` entry point group
(pyproject.toml) as a plugin's would be; `BUILTIN` also serves where prismserve runs uninstalled
(a source tree on PYTHONPATH, the vLLM environment's replicas)."""

from __future__ import annotations

from prismserve.models.family import DefaultApp, ModelFamily

_TINY = "prismserve.models.tiny:"
# The built-in apps (prismserve/apps/), by import path: this room describes them and never imports them.
_MLLM_APP = "prismserve.apps.mllm"
_OMNI_APP = "prismserve.apps.omni"
_IMAGE_APP = "prismserve.apps.image"

QWEN2_5_VL = ModelFamily(
    name="qwen2.5-vl",
    model_types=("qwen2_5_vl",),
    adapter="prismserve.models.qwen2_5_vl:Qwen25VL",
    app=DefaultApp(
        module=_MLLM_APP,
        doc="Qwen2.5-VL: the vision encoder (images and video clips) fissioned from the LLM, streaming text.",
        settings={"modalities": ("image", "video")},
    ),
    engines=("transformers", "vllm"),
    tiny=_TINY + "_qwen2_5_vl",
)

INTERNVL3 = ModelFamily(
    name="internvl3",
    model_types=("internvl",),
    adapter="prismserve.models.internvl:InternVL",
    app=DefaultApp(
        module=_MLLM_APP,
        doc="InternVL3: the vision encoder fissioned from the LLM, streaming text.",
        settings={"image_tokens": "tiles"},  # 256 tokens per 448-px tile, as its processor cuts them
    ),
    engines=("transformers", "vllm"),
    tiny=_TINY + "_internvl3",
)

GEMMA3 = ModelFamily(
    name="gemma3",
    model_types=("gemma3",),
    adapter="prismserve.models.gemma3:Gemma3",
    app=DefaultApp(
        module=_MLLM_APP,
        doc="Gemma 3: the vision encoder fissioned from the LLM, streaming text.",
        settings={"image_tokens": "fixed"},  # 256 tokens per image, whatever its size
    ),
    engines=("transformers", "vllm"),
    tiny=_TINY + "_gemma3",
)


def _omni(name: str, model_type: str, adapter: str, vocoder: str, tiny: str) -> ModelFamily:
    """An Omni family: its default app splits encoders, thinker, talker and `vocoder`; speech out;
    video clips in (with `use_audio_in_video` their soundtracks too) on transformers."""
    doc = f"{name}: image, video and audio encoders, thinker, talker and {vocoder} as separate deployments; text and speech out."
    return ModelFamily(
        name=name.lower(),
        model_types=(model_type,),
        adapter=adapter,
        app=DefaultApp(module=_OMNI_APP, doc=doc, settings={"modalities": ("image", "audio", "video")}),
        engines=("transformers", "vllm"),
        main="thinker",
        tiny=_TINY + tiny,
    )


QWEN2_5_OMNI = _omni(
    "Qwen2.5-Omni", "qwen2_5_omni", "prismserve.models.qwen2_5_omni:Qwen25Omni", "vocoder", "_qwen2_5_omni"
)
QWEN3_OMNI = _omni(
    "Qwen3-Omni", "qwen3_omni_moe", "prismserve.models.qwen3_omni:Qwen3Omni", "code2wav", "_qwen3_omni"
)

QWEN_IMAGE = ModelFamily(
    name="qwen-image",
    model_types=("QwenImagePipeline",),
    adapter="prismserve.models.qwen_image:QwenImage",
    app=DefaultApp(
        module=_IMAGE_APP, doc="Qwen-Image: the text encoder fissioned from the DiT + VAE generator."
    ),
    main="generator",
    tiny=_TINY + "_qwen_image",
)

BUILTIN = (QWEN2_5_VL, INTERNVL3, GEMMA3, QWEN2_5_OMNI, QWEN3_OMNI, QWEN_IMAGE)
"""prismserve's own families, in the order `families()` lists them."""
