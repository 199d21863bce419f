"""prismserve's own model families, declared in the `prismserve.models` entry point group
(pyproject.toml) as a plugin's would be; `BUILTIN` also serves where prismserve runs uninstalled
(a source tree on PYTHONPATH, the vLLM environment's replicas)."""

from __future__ import annotations

from prismserve.models.family import ModelFamily, chat_app, image_app

_VISION = frozenset({"text", "image"})
_OMNI_IN = frozenset({"text", "image", "audio"})
_SPEECH = frozenset({"text", "audio"})
_TINY = "prismserve.testing.tiny:"

QWEN2_5_VL = ModelFamily(
    name="qwen2.5-vl",
    model_types=("qwen2_5_vl",),
    adapter="prismserve.models.qwen2_5_vl:Qwen25VL",
    app=chat_app(
        "MLLMTask",
        "Qwen2.5-VL: the vision encoder (images and video clips) fissioned from the LLM, streaming text.",
        _VISION | {"video"},
        modalities=("image", "video"),
    ),
    input_modalities=_VISION | {"video"},
    engines=("transformers", "vllm"),
    tiny=_TINY + "_qwen2_5_vl",
)

INTERNVL3 = ModelFamily(
    name="internvl3",
    model_types=("internvl",),
    adapter="prismserve.models.internvl:InternVL",
    app=chat_app(
        "MLLMTask", "InternVL3: the vision encoder fissioned from the LLM, streaming text.", _VISION
    ),
    input_modalities=_VISION,
    engines=("transformers", "vllm"),
    tiny=_TINY + "_internvl3",
)

GEMMA3 = ModelFamily(
    name="gemma3",
    model_types=("gemma3",),
    adapter="prismserve.models.gemma3:Gemma3",
    app=chat_app("MLLMTask", "Gemma 3: the vision encoder fissioned from the LLM, streaming text.", _VISION),
    input_modalities=_VISION,
    engines=("transformers", "vllm"),
    tiny=_TINY + "_gemma3",
)

QWEN2_5_OMNI = ModelFamily(
    name="qwen2.5-omni",
    model_types=("qwen2_5_omni",),
    adapter="prismserve.models.qwen2_5_omni:Qwen25Omni",
    app=chat_app(
        "OmniTask",
        "Qwen2.5-Omni: image and audio encoders, thinker, talker and vocoder as separate deployments; "
        "text and speech out.",
        _OMNI_IN,
        _SPEECH,
    ),
    input_modalities=_OMNI_IN,
    output_modalities=_SPEECH,
    engines=("transformers", "vllm"),
    main="thinker",
    tiny=_TINY + "_qwen2_5_omni",
)

QWEN3_OMNI = ModelFamily(
    name="qwen3-omni",
    model_types=("qwen3_omni_moe",),
    adapter="prismserve.models.qwen3_omni:Qwen3Omni",
    app=chat_app(
        "OmniTask",
        "Qwen3-Omni: image and audio encoders, thinker, talker and code2wav as separate deployments; "
        "text and speech out.",
        _OMNI_IN,
        _SPEECH,
    ),
    input_modalities=_OMNI_IN,
    output_modalities=_SPEECH,
    engines=("transformers", "vllm"),
    main="thinker",
    tiny=_TINY + "_qwen3_omni",
)

QWEN_IMAGE = ModelFamily(
    name="qwen-image",
    model_types=("QwenImagePipeline",),
    adapter="prismserve.models.qwen_image:QwenImage",
    app=image_app("Qwen-Image: the text encoder fissioned from the DiT + VAE generator."),
    output_modalities=frozenset({"image"}),
    main="generator",
    tiny=_TINY + "_qwen_image",
)

BUILTIN = (QWEN2_5_VL, INTERNVL3, GEMMA3, QWEN2_5_OMNI, QWEN3_OMNI, QWEN_IMAGE)
"""prismserve's own families, in the order `families()` lists them."""
