"""Tiny random-weight checkpoints, built offline and loaded back through the real `from_pretrained` path.

Each family's checkpoint is written once into a cache directory (`$PRISMSERVE_TINY_CACHE`, default
`~/.cache/prismserve/tiny`) with an offline byte-level BPE tokenizer, a chat template and the
family's preprocessor configuration, so tests and the demo run with no model hub.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prismserve.offline import disable_telemetry

# Bump when what a builder writes changes: older cached checkpoints are then rebuilt.
FORMAT = 11  # 6, 7 and 8 were taken by branches' caches

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
    "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>",
    "<|tts_pad|>", "<|tts_text_bos|>", "<|tts_text_eod|>",
]  # fmt: skip

# What Qwen-Omni processors look up on the tokenizer.
OMNI_TOKENS = {
    "image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>",
}  # fmt: skip


def chat_template(
    image: str = "<|image_pad|>", video: str = "<|video_pad|>", audio: str = "<|AUDIO|>"
) -> str:
    """Qwen-style ChatML; media parts become the family's placeholder tokens."""
    return (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
        f"{{% if c['type'] == 'image' %}}<|vision_start|>{image}<|vision_end|>"
        f"{{% elif c['type'] == 'video' %}}<|vision_start|>{video}<|vision_end|>"
        f"{{% elif c['type'] == 'audio' %}}<|audio_bos|>{audio}<|audio_eos|>"
        "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


_CORPUS = """prismserve serves any-to-any multimodal models: encoders for images, video and audio, one
or more language models, and generators of speech and images. Requests with different input and
output modalities take different paths through those components. What is in the picture? Describe
the sound. The cars are parked on a street; a red car, a blue car and a white van. Thank you.
"""


def cache_dir() -> Path:
    """Where tiny checkpoints are kept."""
    return Path(os.environ.get("PRISMSERVE_TINY_CACHE") or Path.home() / ".cache" / "prismserve" / "tiny")


def tokenizer(template: str | None = None, extra_special_tokens: dict[str, str] | None = None) -> Any:
    """A byte-level BPE tokenizer (about 600 tokens) with the Qwen special tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([_CORPUS] * 4, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=extra_special_tokens or {},
    )
    tok.chat_template = template or chat_template()
    return tok


MROPE_SECTION = [4, 6, 6]
"""M-RoPE sections (temporal, height, width) of the tiny LLMs' 32-wide heads (half of them rotate)."""


def _text_config(tok: Any, ids: dict[str, int], **rope: Any) -> dict[str, Any]:
    """A 2-layer, 64-wide Qwen2 LLM over `tok`'s vocabulary with two 32-wide heads (vLLM's CPU
    attention takes head sizes from 32 up)."""
    return {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        **rope,
    }


_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
           "fullatt_block_indexes": [1], "window_size": 56}  # fmt: skip


def _image_processor() -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    # Small images (at most 8x8 patches of 14 px) keep the encoder fast on a CPU.
    return Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})


def _qwen2_5_vl(out: Path) -> None:
    import torch
    from transformers import AutoImageProcessor, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    # transformers' configs take extra keys (the token ids) as **kwargs; their typed signature omits them.
    config = Qwen2_5_VLConfig(  # type: ignore[call-arg]
        text_config={
            **_text_config(tok, ids, rope_scaling={"type": "mrope", "mrope_section": MROPE_SECTION}),
            "tie_word_embeddings": False,
        },
        vision_config=_VISION,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    torch.manual_seed(0)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(out)
    tok.save_pretrained(out)
    _image_processor().save_pretrained(out)
    AutoImageProcessor.from_pretrained(out)  # fails now, not in a replica, if the files do not load


CODEC_VOCAB = 64
"""Tiny talkers' codec vocabulary; its top ids are the control tokens (pad, start, end, mask)."""
QWEN3_CODEBOOKS = 4
"""Codebooks per frame of the tiny Qwen3-Omni talker (its code predictor fills all but the first)."""


def _qwen2_5_omni(out: Path) -> None:
    import torch
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration, WhisperFeatureExtractor

    tok = tokenizer(chat_template(image="<|IMAGE|>", video="<|VIDEO|>"), OMNI_TOKENS)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    rope = {"rope_parameters": {"rope_type": "default", "mrope_section": MROPE_SECTION, "rope_theta": 1e6}}
    media_ids = {
        "audio_token_index": ids["<|AUDIO|>"],
        "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"],
        "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
    }
    thinker = {
        # Untied, as transformers' thinker runs it (its own lm_head); vLLM would tie it otherwise.
        "text_config": {**_text_config(tok, ids, **rope), "tie_word_embeddings": False},
        "audio_config": {"num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 2,
                         "encoder_ffn_dim": 64, "d_model": 32, "output_dim": 64},
        "vision_config": _VISION,
        "user_token_id": ids["<|im_start|>"],
        **media_ids,
    }  # fmt: skip
    talker = {
        "vocab_size": CODEC_VOCAB, "embedding_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "max_position_embeddings": 4096, "spatial_merge_size": 2,
        "tts_text_start_token_id": ids["<|tts_text_bos|>"], "tts_text_end_token_id": ids["<|tts_text_eod|>"],
        "tts_text_pad_token_id": ids["<|tts_pad|>"],
        "tts_codec_pad_token_id": CODEC_VOCAB - 5, "tts_codec_start_token_id": CODEC_VOCAB - 4,
        "tts_codec_end_token_id": CODEC_VOCAB - 3, "tts_codec_mask_token_id": CODEC_VOCAB - 2,
        "vision_end_token_id": ids["<|vision_end|>"],
        "rope_parameters": {**rope["rope_parameters"], "mrope_section": [2, 3, 3]},  # 16-wide heads
        **media_ids,
    }  # fmt: skip
    token2wav = {
        "dit_config": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 16,
                       "emb_dim": 16, "num_embeds": CODEC_VOCAB, "enc_emb_dim": 16, "enc_dim": 16,
                       "enc_channels": [16, 16, 16, 16, 48], "enc_attention_channels": 8, "enc_se_channels": 8,
                       "look_ahead_layers": [1], "look_backward_layers": [0]},
        # The real upsampling (5*3*2*2*2*2 = 240 samples per mel frame): 24 kHz audio.
        "bigvgan_config": {"upsample_initial_channel": 128, "resblock_kernel_sizes": [3],
                           "resblock_dilation_sizes": [[1, 3, 5]]},
    }  # fmt: skip
    config = Qwen2_5OmniConfig(
        thinker_config=thinker, talker_config=talker, token2wav_config=token2wav, enable_audio_output=True
    )
    torch.manual_seed(0)
    model = Qwen2_5OmniForConditionalGeneration(config)
    speaker = {
        "bos_token": ids["<|tts_text_bos|>"],
        "cond": torch.randn(1, 16),
        "ref_mel": torch.randn(1, 30, 80),
    }
    # Random weights give a near-silent vocoder (peaks ~1e-8): scale its last layer to peak near 0.5,
    # so that audio comparisons and 16-bit PCM carry signal. And a random talker ends its speech after
    # a few codes: zero logits for its end tokens make it speak until max_codes, as a real utterance
    # of a few seconds would (streaming and batching have something to do).
    with torch.no_grad():
        model.talker.codec_head.weight[[CODEC_VOCAB - 5, CODEC_VOCAB - 3]] = 0
        wav = model.token2wav(
            torch.arange(20)[None], conditioning=speaker["cond"], reference_mel=speaker["ref_mel"]
        )
        model.token2wav.code2wav_bigvgan_model.conv_post.weight *= 0.5 / float(wav.abs().max())
    model.save_pretrained(out)
    torch.save({"Chelsie": speaker}, out / "spk_dict.pt")
    tok.save_pretrained(out)
    # One preprocessor_config.json holds the image processor's and the feature extractor's fields.
    merged = {**WhisperFeatureExtractor(feature_size=128).to_dict(), **_image_processor().to_dict()}
    (out / "preprocessor_config.json").write_text(json.dumps(merged, indent=2))


def _qwen3_omni(out: Path) -> None:
    """Qwen3-Omni: MoE thinker, DeepStack vision encoder, audio encoder, MoE talker with its code
    predictor, code2wav."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

    tok = tokenizer(chat_template(image="<|IMAGE|>", video="<|VIDEO|>"), OMNI_TOKENS)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6, "mrope_interleaved": True}
    # The thinker as vLLM runs it too: 32-wide heads (vLLM's CPU attention), its own lm_head, and the
    # talker's layer (accept_hidden_layer 3) above the DeepStack levels (added after layers 0-1), as in
    # the real model (layer 24 of 48, levels after layers 0-2): there vLLM's captured layer and
    # transformers' agree; below, vLLM's would include a DeepStack level that transformers' lacks.
    thinker = {
        "text_config": {**_text_config(tok, ids), "num_hidden_layers": 4, "moe_intermediate_size": 32,
                        "num_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": False,
                        "rope_parameters": {**rope, "mrope_section": MROPE_SECTION}},
        "audio_config": {"num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                         "d_model": 32, "output_dim": 64, "downsample_hidden_size": 16},
        # image_size and apply_vit_abs_pos_embed: what vLLM reads (real checkpoints have them).
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                          "deepstack_visual_indexes": [0, 1], "patch_size": 16, "num_position_embeddings": 256,
                          "image_size": 256, "apply_vit_abs_pos_embed": True},
        "audio_token_id": ids["<|AUDIO|>"], "image_token_id": ids["<|IMAGE|>"], "video_token_id": ids["<|VIDEO|>"],
        "audio_start_token_id": ids["<|audio_bos|>"], "user_token_id": ids["<|im_start|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
    }  # fmt: skip
    # The talker's vocabulary: codebook 0 below CODEC_VOCAB, then (as in the real model) a top range of
    # 1024 control ids that generation suppresses, the codec end token excepted.
    codec = dict(zip(["codec_pad_id", "codec_bos_id", "codec_eos_token_id", "codec_nothink_id",
                      "codec_think_bos_id", "codec_think_eos_id"], range(CODEC_VOCAB + 1000, CODEC_VOCAB + 1006), strict=True))  # fmt: skip
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 16}  # fmt: skip
    talker = {
        "text_config": {**small, "vocab_size": CODEC_VOCAB + 1024, "moe_intermediate_size": 32, "num_experts": 4,
                        "shared_expert_intermediate_size": 32,
                        "num_experts_per_tok": 2, "rope_parameters": rope},
        "code_predictor_config": {**small, "vocab_size": CODEC_VOCAB, "num_code_groups": QWEN3_CODEBOOKS,
                                  "layer_types": ["full_attention"] * 2},
        "num_code_groups": QWEN3_CODEBOOKS, "thinker_hidden_size": 64, "accept_hidden_layer": 3, "spatial_merge_size": 2,
        "speaker_id": {"chelsie": CODEC_VOCAB + 1010}, **codec,
        "audio_token_id": ids["<|AUDIO|>"], "image_token_id": ids["<|IMAGE|>"], "video_token_id": ids["<|VIDEO|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "audio_start_token_id": ids["<|audio_bos|>"],
    }  # fmt: skip
    code2wav = {"codebook_size": CODEC_VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 2, "num_quantizers": QWEN3_CODEBOOKS, "decoder_dim": 32}  # fmt: skip
    roles = {f"{role}_token_id": tok.encode(role)[0] for role in ("system", "user", "assistant")}
    config = Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, enable_audio_output=True,
        im_start_token_id=ids["<|im_start|>"], im_end_token_id=ids["<|im_end|>"], tts_pad_token_id=ids["<|tts_pad|>"],
        tts_bos_token_id=ids["<|tts_text_bos|>"], tts_eos_token_id=ids["<|tts_text_eod|>"], **roles,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3OmniMoeForConditionalGeneration(config)
    with torch.no_grad():
        # transformers leaves the talker's experts uninitialised (whatever memory held): the build
        # would not be reproducible.
        for name, weight in model.talker.named_parameters():
            if ".mlp.experts." in name:
                weight.normal_(0.0, model.talker.config.initializer_range)
        # Random code2wav weights give near silence (peaks ~1e-7): scale its output to ~0.5.
        frames = (torch.arange(40) % CODEC_VOCAB).repeat(1, QWEN3_CODEBOOKS, 1)
        model.code2wav.decoder[-1].conv.weight *= 0.5 / float(model.code2wav(frames).abs().max())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    images = _image_processor()
    images.patch_size = 16  # Qwen3's vision patches
    merged = {**WhisperFeatureExtractor(feature_size=128).to_dict(), **images.to_dict()}
    (out / "preprocessor_config.json").write_text(json.dumps(merged, indent=2))


def _qwen_image(out: Path) -> None:
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text_encoder = Qwen2_5_VLConfig(
        text_config=_text_config(tok, ids, rope_scaling={"type": "mrope", "mrope_section": MROPE_SECTION}),
        vision_config=_VISION,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    latent = 4  # latent channels; the DiT sees 2x2 patches of them
    torch.manual_seed(0)
    QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            shift=1.0,
            use_dynamic_shifting=True,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        ),
        vae=AutoencoderKLQwenImage(
            base_dim=16,
            z_dim=latent,
            dim_mult=[1, 2, 2, 2],
            num_res_blocks=1,
            latents_mean=[0.0] * latent,
            latents_std=[1.0] * latent,
        ),  # fmt: skip
        text_encoder=Qwen2_5_VLForConditionalGeneration(text_encoder),
        tokenizer=tok,
        transformer=QwenImageTransformer2DModel(
            in_channels=4 * latent,
            out_channels=latent,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=64,
            axes_dims_rope=(4, 6, 6),
        ),  # fmt: skip
    ).save_pretrained(out)  # type: ignore[attr-defined]  # DiffusionPipeline's, which diffusers' types do not reach


def _internvl3(out: Path) -> None:
    import torch
    from transformers import InternVLConfig, InternVLForConditionalGeneration
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    markers = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
               "video_token": "<|video_pad|>"}  # fmt: skip
    tok = tokenizer(chat_template(image="<IMG_CONTEXT>"), markers)
    tok.add_special_tokens({"additional_special_tokens": ["<img>", "</img>", "<IMG_CONTEXT>"]})
    ids = {t: tok.convert_tokens_to_ids(t) for t in [*SPECIAL_TOKENS, "<IMG_CONTEXT>"]}
    # 56-px tiles of 14-px patches: 16 patches, pixel-shuffled 2x2 into 4 tokens per tile.
    config = InternVLConfig(
        vision_config={"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                       "image_size": [56, 56], "patch_size": [14, 14]},
        text_config={"model_type": "qwen2", **_text_config(tok, ids)},
        image_token_id=ids["<IMG_CONTEXT>"],
        image_seq_length=4,
    )  # fmt: skip
    torch.manual_seed(0)
    InternVLForConditionalGeneration(config).save_pretrained(out)
    tok.save_pretrained(out)
    GotOcr2ImageProcessorPil(
        size={"height": 56, "width": 56}, crop_to_patches=True, max_patches=4
    ).save_pretrained(out)
    (out / "processor_config.json").write_text(
        json.dumps({"image_seq_length": 4, "processor_class": "InternVLProcessor"})
    )


def _gemma3(out: Path) -> None:
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    markers = {
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
    }
    tok = tokenizer(chat_template(image="<start_of_image>"), markers)
    tok.add_special_tokens({"additional_special_tokens": list(markers.values())})
    tok.add_tokens(
        ["\n", "\n\n", "\n\n\n", "\n\n\n\n"]
    )  # single tokens in Gemma's vocabulary (vLLM looks them up)
    ids = {t: tok.convert_tokens_to_ids(t) for t in [*SPECIAL_TOKENS, *markers.values()]}
    text = _text_config(tok, ids)
    # 56-px images of 14-px patches (4x4), average-pooled to 2x2: 4 soft tokens per image. No pooling
    # head on the vision tower, as in the real model.
    config = Gemma3Config(
        text_config={**text, "query_pre_attn_scalar": 32, "sliding_window": 64},
        vision_config={"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                       "image_size": 56, "patch_size": 14, "vision_use_head": False},
        mm_tokens_per_image=4,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config)
    # transformers initialises the projector to zeros (images would carry no signal): give it weights.
    model.model.multi_modal_projector.mm_input_projection_weight.data.normal_(0.0, 0.5)
    model.save_pretrained(out)
    _rename_weights(out, "vision_tower.", "vision_tower.vision_model.")
    tok.save_pretrained(out)
    Gemma3ImageProcessorPil(size={"height": 56, "width": 56}).save_pretrained(out)
    (out / "processor_config.json").write_text(
        json.dumps({"image_seq_length": 4, "processor_class": "Gemma3Processor"})
    )


def _rename_weights(out: Path, prefix: str, new_prefix: str) -> None:
    """Rename the saved weights under `prefix` to `new_prefix` (the layout released checkpoints have,
    which transformers also loads, where its own save writes another)."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    weights = {
        new_prefix + k[len(prefix) :] if k.startswith(prefix) and not k.startswith(new_prefix) else k: v
        for k, v in load_file(path).items()
    }
    save_file(weights, path, metadata={"format": "pt"})


def _internvl3_tuned(out: Path) -> None:
    """A fine-tune of the tiny InternVL3: the same vision tower and projector, another LLM."""
    import torch
    from transformers import InternVLForConditionalGeneration

    base = build("internvl3", out.parent)
    model = InternVLForConditionalGeneration.from_pretrained(base)
    torch.manual_seed(1)
    for parameter in model.model.language_model.parameters():
        parameter.data.normal_(0.0, 0.02)
    model.save_pretrained(out)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "processor_config.json",
    ):
        shutil.copy(base / name, out / name)


def _qwen2_5_vl_w8a8(out: Path) -> None:
    """The tiny Qwen2.5-VL quantized as compressed-tensors' W8A8 int8 (the scheme vLLM-CPU runs
    on any x86 CPU, AVX2 included): each linear layer of the LLM holds int8 weights with a scale per
    output channel and quantizes its input per token at run time; the vision tower, embeddings and
    LM head stay float32. Rounded by hand as the format defines it: no calibration to need."""
    import torch
    from safetensors.torch import load_file, save_file

    base = build("qwen2.5-vl", out.parent)
    shutil.copytree(base, out, dirs_exist_ok=True)
    weights: dict[str, Any] = {}
    for name, tensor in load_file(base / "model.safetensors").items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            scale = tensor.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
            weights[name] = torch.round(tensor / scale).clamp(-128, 127).to(torch.int8)
            weights[name.removesuffix("weight") + "weight_scale"] = scale
        else:
            weights[name] = tensor
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})

    def int8(strategy: str, dynamic: bool) -> dict[str, Any]:
        return {"num_bits": 8, "type": "int", "symmetric": True, "strategy": strategy, "dynamic": dynamic}

    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head", "re:.*visual.*"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": int8("channel", False),
                "input_activations": int8("token", True),
            }
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))


BUILDERS: dict[str, Callable[[Path], None]] = {
    "qwen2.5-vl": _qwen2_5_vl,
    "qwen2.5-vl-w8a8": _qwen2_5_vl_w8a8,
    "qwen2.5-omni": _qwen2_5_omni,
    "qwen3-omni": _qwen3_omni,
    "qwen-image": _qwen_image,
    "internvl3": _internvl3,
    "internvl3-tuned": _internvl3_tuned,
    "gemma3": _gemma3,
}
"""Family name -> function writing a tiny checkpoint into an empty directory."""


def build(family: str, root: Path | None = None) -> Path:
    """The directory of `family`'s tiny checkpoint, built on first use."""
    if family not in BUILDERS:
        raise ValueError(f"no tiny builder for {family!r}; families: {sorted(BUILDERS)}")
    disable_telemetry()
    root = root or cache_dir()
    target = root / f"{family}-v{FORMAT}"
    if target.is_dir():  # moved into place whole, so complete
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{family}-", dir=root))
    try:
        BUILDERS[family](scratch)
        try:
            scratch.rename(target)  # atomic: a reader sees a whole checkpoint or none
        except OSError:
            if not target.is_dir():  # not just another process that finished first
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
