"""InternVL3: an InternViT image encoder with a pixel-shuffle MLP projector, and a Qwen2.5 LLM (1-D RoPE).

Split: an image is cropped into tiles (and a thumbnail); the vision tower and projector turn each tile
into `image_seq_length` embeddings. What crosses to the LLM is `[tiles, image_seq_length, hidden]`
per image; the LLM puts `<img>`, one context token per embedding, `</img>` where the image was.
"""

from __future__ import annotations

from typing import Any

from prismserve.models.base import Encoded, as_numpy
from prismserve.models.vision_llm import VISION_TOWER, VisionLLM


class InternVL(VisionLLM):
    """InternVL3 in transformers' format (`InternVLForConditionalGeneration`, the `-hf` checkpoints)."""

    family = "internvl3"
    component_prefixes = {"image": VISION_TOWER}
    model_class = "InternVLForConditionalGeneration"
    processor_class = "InternVLProcessor"

    def run_encoder(self, pixels: Any) -> list[Encoded]:
        import torch

        features = self.model.get_image_features(
            pixels["pixel_values"].to(self.device, self.model.dtype)
        ).pooler_output
        tiles = pixels["num_patches"]
        parts = torch.split(features, tiles.tolist() if hasattr(tiles, "tolist") else list(tiles))
        return [Encoded("image", as_numpy(p), {"tiles": len(p)}) for p in parts]

    def placeholder(self, encoded: Encoded) -> str:
        per_image = encoded.embeddings.shape[0] * encoded.embeddings.shape[1]
        return f"{self.processor.start_image_token}{self.processor.image_token * per_image}{self.processor.end_image_token}"

    def encoder_outputs(self, embeddings: list[Any]) -> Any:
        import torch

        return torch.cat(embeddings)  # [all tiles, image_seq_length, hidden]
