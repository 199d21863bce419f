"""Qwen2.5-VL: a ViT image encoder (window attention, 2x2 patch merger) and a Qwen2.5 LLM with M-RoPE.

Split: the vision tower (`model.visual`) runs alone on each image; its merged patch embeddings
(`[grid_t * grid_h * grid_w / merge^2, hidden]`) and the image's `grid_thw` cross to the LLM, which
places them at the image-pad tokens and derives its 3-D rotary positions from `grid_thw`.
"""

from __future__ import annotations

from typing import Any

from prismserve.models.base import Encoded, as_numpy
from prismserve.models.vision_llm import VisionLLM


class Qwen25VL(VisionLLM):
    """Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`)."""

    family = "qwen2.5-vl"
    model_class = "Qwen2_5_VLForConditionalGeneration"
    processor_class = "Qwen2_5_VLProcessor"

    def keep_encoder(self, model: Any) -> Any:
        return model.model.visual

    def drop_encoder(self, model: Any) -> None:
        del model.model.visual

    def run_encoder(self, pixels: Any) -> list[Encoded]:
        import torch

        grids = pixels["image_grid_thw"]
        merged = self.model(pixels["pixel_values"].to(self.device, self.model.dtype), grid_thw=grids.to(self.device))
        sizes = (grids.prod(-1) // self.model.spatial_merge_size**2).tolist()
        parts = torch.split(merged.pooler_output, sizes)
        return [Encoded("image", as_numpy(p), {"grid_thw": g.tolist()}) for p, g in zip(parts, grids, strict=True)]

    def llm_extras(self, inputs: dict[str, Any], encoded: list[Encoded]) -> dict[str, Any]:
        import torch

        type_ids = self.processor.create_mm_token_type_ids(inputs["input_ids"].cpu())
        return {
            "mm_token_type_ids": torch.tensor(type_ids, device=self.device),
            "image_grid_thw": torch.tensor([e.meta["grid_thw"] for e in encoded], device=self.device),
        }
