"""Gemma 3: a SigLIP image encoder with an average-pooling projector, and a Gemma 3 LLM that attends
bidirectionally within each image's tokens.

Split: the vision tower and projector turn each image (resized to the encoder's size) into
`mm_tokens_per_image` embeddings; those cross to the LLM, which writes the image as
`<start_of_image>`, one soft token per embedding, `<end_of_image>` and marks the soft tokens
(`token_type_ids`) for its bidirectional image attention.
"""

from __future__ import annotations

from typing import Any

from prismserve.models.base import Encoded, as_numpy
from prismserve.models.vision_llm import VISION_TOWER, VisionLLM


class Gemma3(VisionLLM):
    """Gemma 3 (`Gemma3ForConditionalGeneration`)."""

    family = "gemma3"
    component_prefixes = {"image": VISION_TOWER}
    model_class = "Gemma3ForConditionalGeneration"
    processor_class = "Gemma3Processor"

    def run_encoder(self, pixels: Any) -> list[Encoded]:
        features = self.model.get_image_features(
            pixels["pixel_values"].to(self.device, self.model.dtype)
        ).pooler_output
        return [Encoded("image", as_numpy(f)) for f in features]

    def placeholder(self, encoded: Encoded) -> str:
        soft = self.tokenizer.image_token * len(encoded.embeddings)
        return f"\n\n{self.tokenizer.boi_token}{soft}{self.tokenizer.eoi_token}\n\n"

    def llm_extras(self, inputs: dict[str, Any], encoded: list[Encoded]) -> dict[str, Any]:
        import torch

        type_ids = self.processor.create_mm_token_type_ids(inputs["input_ids"].cpu())
        return {"token_type_ids": torch.tensor(type_ids, device=self.device)}

    def encoder_outputs(self, embeddings: list[Any]) -> Any:
        import torch

        return torch.stack(embeddings)  # [images, mm_tokens_per_image, hidden]
