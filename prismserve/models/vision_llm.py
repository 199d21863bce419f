"""VisionLLM: the shape shared by image+text LLM families (an image encoder, an LLM fed through
transformers' `mm_encoder_outputs`). A family names its classes and fills in four hooks."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from prismserve.models.base import Adapter, Encoded, MediaError, MediaInput, build_processor, load_pretrained
from prismserve.models.media import load_image

VISION_TOWER = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)
"""Where transformers' LLaVA-style checkpoints (InternVL3-hf, Gemma 3) keep the vision tower and
its projector: the image encoder's weights."""


class VisionLLM(Adapter):
    """An image encoder and an LLM; the encoder's per-image output replaces the image's placeholder."""

    encoder_modalities: ClassVar[tuple[str, ...]] = ("image",)
    model_class: ClassVar[str]  # transformers class of the whole model
    processor_class: ClassVar[str]  # transformers processor class (assembled from the checkpoint's parts)

    @cached_property
    def processor(self) -> Any:
        import transformers

        return build_processor(getattr(transformers, self.processor_class), self.path)

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def _load(self) -> Any:
        import transformers

        return load_pretrained(getattr(transformers, self.model_class), self.path, self.device, self.dtype)

    # --- hooks ----------------------------------------------------------------------------------
    def keep_encoder(self, model: Any) -> Any:
        """The module that encodes images (the rest of `model` is freed). Default: the base model
        without its LLM — a vision tower and a projector, with the base model's feature method."""
        del model.model.language_model
        return model.model

    def drop_encoder(self, model: Any) -> None:
        """Remove the image encoder from the whole model (the LLM replica gets embeddings)."""
        del model.model.vision_tower, model.model.multi_modal_projector

    def run_encoder(self, pixels: Any) -> list[Encoded]:
        """One Encoded per image of the image processor's output `pixels`."""
        raise NotImplementedError

    def placeholder(self, encoded: Encoded) -> str:
        """The text that stands for one encoded item in the expanded prompt."""
        return self.media_token(encoded.modality) * len(encoded.embeddings)

    def media_token(self, modality: str) -> str:
        """The processor's placeholder token of `modality` (`image_token`, `video_token`)."""
        return getattr(self.processor, f"{modality}_token")

    def raw_video_inputs(self, text: str, media: list[MediaInput]) -> dict[str, Any]:
        """Model inputs for a prompt whose raw media include video clips (families with a video encoder)."""
        raise MediaError(f"{self.family} takes no video")

    def expand(self, text: str, placeholders: list[tuple[str, str]]) -> str:
        """`text` with its media tokens, in order, replaced by `placeholders` ((modality, text) each)."""
        tokens = [self.media_token(m) for m in self.encoder_modalities]
        pieces = re.split("(" + "|".join(map(re.escape, tokens)) + ")", text)
        if pieces[1::2] != [self.media_token(modality) for modality, _ in placeholders]:
            raise MediaError(
                f"the conversation's {len(pieces) // 2} media do not match the {len(placeholders)} items that arrived"
            )
        return pieces[0] + "".join(p + rest for (_, p), rest in zip(placeholders, pieces[2::2], strict=True))

    def llm_extras(self, inputs: dict[str, Any], encoded: list[Encoded]) -> dict[str, Any]:
        """Inputs the LLM needs besides tokens and embeddings (positions, grids …)."""
        return {}

    def encoder_outputs(self, embeddings: list[Any]) -> Any:
        """`mm_encoder_outputs["image"].pooler_output` from the images' embeddings, in order."""
        return tuple(embeddings)

    # --- the Adapter API ------------------------------------------------------------------------
    def load_encoder(self, modality: str) -> None:
        self.check_modality(modality)
        self.model = self.keep_encoder(self._load())
        self.processor  # noqa: B018 - loaded now rather than on the first request

    def encode(self, modality: str, items: list[bytes]) -> list[Encoded]:
        import torch

        self.check_modality(modality)
        pixels = self.pixels([load_image(d) for d in items])
        with self.lock, torch.inference_mode():
            return self.run_encoder(pixels)

    def pixels(self, images: list[Any], text: list[str] | None = None) -> Any:
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
            self.drop_encoder(self.model)  # embeddings arrive precomputed
        self.processor  # noqa: B018

    def llm_inputs(
        self,
        conversation: list[dict[str, Any]],
        encoded: list[Encoded] | None = None,
        media: list[MediaInput] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        import torch
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        text = self.processor.apply_chat_template(
            conversation, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        if media:
            unsupported = sorted({m.modality for m in media} - set(self.encoder_modalities))
            if unsupported:
                raise MediaError(
                    f"{self.family} takes {', '.join(self.encoder_modalities)} only, got {unsupported}"
                )
            if any(m.modality == "video" for m in media):
                return self.raw_video_inputs(text, media)
            return dict(self.pixels([load_image(m.data) for m in media], [text]).to(self.device))
        if not encoded:
            return dict(self.processor(text=[text], return_tensors="pt").to(self.device))
        # The processor would expand each item's placeholder from the media; the size came with its embeddings.
        expanded = self.expand(text, [(e.modality, self.placeholder(e)) for e in encoded])
        inputs = {k: v.to(self.device) for k, v in self.tokenizer([expanded], return_tensors="pt").items()}
        inputs.update(self.llm_extras(inputs, encoded))
        # torch.tensor copies: the embeddings may be read-only views into another replica's slab.
        inputs["mm_encoder_outputs"] = {}
        for modality in dict.fromkeys(e.modality for e in encoded):
            embeddings = [
                torch.tensor(np.asarray(e.embeddings)).to(self.device, self.model.dtype)
                for e in encoded
                if e.modality == modality
            ]
            inputs["mm_encoder_outputs"][modality] = BaseModelOutputWithPooling(
                pooler_output=self.encoder_outputs(embeddings)
            )
        return inputs
