"""Qwen2.5-VL: a ViT image encoder (window attention, 2x2 patch merger) and a Qwen2.5 LLM with M-RoPE.

Split: the vision tower (`model.visual`) runs alone on each image; its merged patch embeddings
(`[grid_t * grid_h * grid_w / merge^2, hidden]`) and the image's `grid_thw` cross to the LLM, which
places them at the image-pad tokens and derives its 3-D rotary positions from `grid_thw`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from prismserve.models.base import Adapter, Encoded, MediaError, MediaInput, as_numpy, build_processor
from prismserve.models.media import load_image


class Qwen25VL(Adapter):
    """Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`)."""

    family = "qwen2.5-vl"
    model_types = ("qwen2_5_vl",)
    encoder_modalities = ("image",)

    @cached_property
    def processor(self) -> Any:
        from transformers import Qwen2_5_VLProcessor

        return build_processor(Qwen2_5_VLProcessor, self.path)

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def _load(self) -> Any:
        from transformers import Qwen2_5_VLForConditionalGeneration

        dtype = "auto" if self.device != "cpu" else None
        return Qwen2_5_VLForConditionalGeneration.from_pretrained(self.path, dtype=dtype).to(self.device).eval()

    def load_encoder(self, modality: str) -> None:
        self.check_modality(modality)
        model = self._load()
        self.model = model.model.visual  # the LLM's weights are freed with `model`
        self.processor  # noqa: B018 - loaded now rather than on the first request

    def encode(self, modality: str, items: list[bytes]) -> list[Encoded]:
        import torch

        self.check_modality(modality)
        pixels = self._pixels([load_image(d) for d in items])
        grids = pixels["image_grid_thw"]
        with self.lock, torch.inference_mode():
            merged = self.model(pixels["pixel_values"].to(self.device, self.model.dtype), grid_thw=grids.to(self.device))
        sizes = (grids.prod(-1) // self.model.spatial_merge_size**2).tolist()
        parts = torch.split(merged.pooler_output, sizes)
        return [Encoded("image", as_numpy(p), {"grid_thw": g.tolist()}) for p, g in zip(parts, grids, strict=True)]

    def _pixels(self, images: list[Any], text: list[str] | None = None) -> Any:
        """The processor's tensors for `images` (and `text`); images it cannot take are a MediaError."""
        try:
            if text is None:
                return self.processor.image_processor(images=images, return_tensors="pt")
            return self.processor(text=text, images=images, return_tensors="pt")
        except ValueError as exc:  # e.g. an aspect ratio beyond what the vision tower takes
            raise MediaError(f"image cannot be processed: {exc}") from None

    def load_llm(self, with_encoders: bool) -> None:
        self.model = self._load()
        if not with_encoders:
            del self.model.model.visual  # embeddings arrive precomputed
        self.processor  # noqa: B018

    def llm_inputs(
        self,
        conversation: list[dict[str, Any]],
        encoded: list[Encoded] | None = None,
        media: list[MediaInput] | None = None,
    ) -> dict[str, Any]:
        import torch
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        text = self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        if media:
            unsupported = sorted({m.modality for m in media} - {"image"})
            if unsupported:
                raise MediaError(f"{self.family} takes images only, got {unsupported}")
            return dict(self._pixels([load_image(m.data) for m in media], [text]).to(self.device))
        if not encoded:
            return dict(self.processor(text=[text], return_tensors="pt").to(self.device))
        # The processor would expand each image pad from the image's grid; the grid came with the embeddings.
        pad = self.processor.image_token
        pieces = text.split(pad)
        if len(pieces) - 1 != len(encoded):
            raise MediaError(f"the conversation has {len(pieces) - 1} images but {len(encoded)} embeddings arrived")
        expanded = pieces[0] + "".join(pad * len(e.embeddings) + rest for e, rest in zip(encoded, pieces[1:], strict=True))
        ids = self.tokenizer([expanded], return_tensors="pt")
        inputs = {k: v.to(self.device) for k, v in ids.items()}
        type_ids = self.processor.create_mm_token_type_ids(ids["input_ids"])
        inputs["mm_token_type_ids"] = torch.tensor(type_ids, device=self.device)
        inputs["image_grid_thw"] = torch.tensor([e.meta["grid_thw"] for e in encoded], device=self.device)
        dtype = self.model.dtype
        # torch.tensor copies: the embeddings may be read-only views into another replica's slab.
        embeddings = tuple(torch.tensor(np.asarray(e.embeddings)).to(self.device, dtype) for e in encoded)
        inputs["mm_encoder_outputs"] = {"image": BaseModelOutputWithPooling(pooler_output=embeddings)}
        return inputs
