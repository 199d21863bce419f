"""Qwen3-Omni (MoE thinker): image and audio encoders and the thinker, split like Qwen2.5-Omni.

What differs from Qwen2.5-Omni at the split: the vision encoder also returns DeepStack features
(the merged patches of some of its layers, added to the thinker's first layers' hidden states at
the image positions). An image's encoding is therefore `[1 + levels, tokens, hidden]`: the
embeddings, then one row per DeepStack level; the thinker gets them through `mm_encoder_outputs`.
Speech output (the talker with its multi-codebook code predictor, code2wav) is not split yet.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prismserve.models.base import Encoded, as_numpy
from prismserve.models.qwen2_5_omni import Qwen25Omni


class Qwen3Omni(Qwen25Omni):
    """Qwen3-Omni (`Qwen3OmniMoeForConditionalGeneration`): encoders and thinker; text out."""

    family = "qwen3-omni"
    model_class = "Qwen3OmniMoeForConditionalGeneration"
    processor_class = "Qwen3OmniMoeProcessor"

    def encode(self, modality: str, items: list[bytes]) -> list[Encoded]:
        if modality != "image":
            return super().encode(modality, items)
        import torch

        from prismserve.models.media import load_image

        self.check_modality(modality)
        pixels = self.image_pixels([load_image(d) for d in items])
        grids = pixels["image_grid_thw"].to(self.device)
        with self.lock, torch.inference_mode():
            out = self.model.get_image_features(pixels["pixel_values"].to(self.device), grids)
        levels = out.deepstack_features  # per level: one tensor per image
        return [
            Encoded("image", as_numpy(torch.stack([main, *(level[i] for level in levels)])), {"grid_thw": g.tolist()})
            for i, (main, g) in enumerate(zip(out.pooler_output, grids, strict=True))
        ]

    def audio_token_counts(self, feature_lengths: Any) -> list[int]:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

        return _get_feat_extract_output_lengths(feature_lengths, self.model.audio_tower.n_window).tolist()

    def token_count(self, encoded: Encoded) -> int:
        return encoded.embeddings.shape[1] if encoded.modality == "image" else len(encoded.embeddings)

    def place_images(self, inputs: dict[str, Any], embeds: Any, images: list[Encoded]) -> Any:
        import torch
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import BaseModelOutputWithDeepstackFeatures

        stacks = [torch.tensor(np.asarray(e.embeddings)).to(self.device, embeds.dtype) for e in images]  # copies
        inputs["mm_encoder_outputs"] = {
            "image": BaseModelOutputWithDeepstackFeatures(
                pooler_output=tuple(s[0] for s in stacks),
                deepstack_features=[tuple(s[level] for s in stacks) for level in range(1, stacks[0].shape[0])],
            )
        }
        return embeds  # the thinker places them (and adds the DeepStack rows in its first layers)

    def load_talker(self) -> None:
        raise NotImplementedError(f"{self.family}: speech output is not split yet; serve text with MLLMTask")

    load_vocoder = load_talker
