"""Qwen-Image (diffusers `QwenImagePipeline`): a Qwen2.5-VL text encoder, a DiT and a VAE.

Split: the text encoder runs alone and hands the DiT the prompt's last hidden states (`[tokens,
hidden]`, the template's system prefix dropped) and, for classifier-free guidance, the negative
prompt's; the generator (DiT + scheduler + VAE) denoises from those. The pipeline's own code runs on
both sides, so the split computes what the whole pipeline computes.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from prismserve.models.base import LOADING, as_numpy, default_device, quiet_transformers
from prismserve.offline import disable_telemetry


class QwenImage:
    """Qwen-Image: `encode_prompt` on the text encoder, `generate` on the DiT + VAE, or both (monolith)."""

    family = "qwen-image"

    def __init__(self, path: str, device: str | None = None) -> None:
        disable_telemetry()
        quiet_transformers()
        self.path = path
        self.device = device or default_device()
        self.pipeline: Any = None

    def _load(self, **without: None) -> None:
        import threading

        from diffusers import QwenImagePipeline
        from diffusers.utils import logging

        logging.disable_progress_bar()
        dtype = {"torch_dtype": "auto"} if self.device != "cpu" else {}
        # Straight onto the device (diffusers maps whole pipelines to "cpu" or "cuda" only); the
        # components given as None are not loaded at all.
        mapped = self.device in ("cpu", "cuda")
        with LOADING:
            pipeline = QwenImagePipeline.from_pretrained(
                self.path, **without, **dtype, **({"device_map": self.device} if mapped else {})
            )
        self.pipeline = pipeline if mapped else pipeline.to(self.device)
        self.pipeline.set_progress_bar_config(disable=True)
        self.lock = threading.Lock()  # a pipeline runs one call at a time

    def load_text_encoder(self) -> None:
        """Load the text encoder and tokenizer only."""
        self._load(transformer=None, vae=None)

    def load_generator(self) -> None:
        """Load the DiT, scheduler and VAE only."""
        self._load(text_encoder=None, tokenizer=None)

    def load_monolith(self) -> None:
        """Load the whole pipeline."""
        self._load()

    def encode_prompt(self, prompt: str) -> np.ndarray:
        """The prompt's conditioning `[tokens, hidden]` (float32)."""
        import torch

        with self.lock, torch.inference_mode():
            embeds, _ = self.pipeline.encode_prompt(prompt, device=self.device)
        return as_numpy(embeds[0])

    def generate(
        self,
        prompt: str | None = None,
        embeds: np.ndarray | None = None,
        negative: np.ndarray | None = None,
        *,
        width: int,
        height: int,
        steps: int,
        seed: int,
        guidance: float = 4.0,
        negative_prompt: str | None = None,
    ) -> bytes:
        """A PNG image from a prompt (monolith) or its conditioning (split); `seed` fixes the noise."""
        import torch
        from PIL import Image

        args: dict[str, Any] = {
            "width": width,
            "height": height,
            "num_inference_steps": steps,
            "output_type": "np",
        }
        if embeds is not None:
            dtype = self.pipeline.transformer.dtype
            args["prompt_embeds"] = torch.tensor(np.asarray(embeds))[None].to(self.device, dtype)
            if negative is not None:
                args["negative_prompt_embeds"] = torch.tensor(np.asarray(negative))[None].to(
                    self.device, dtype
                )
        else:
            args["prompt"] = prompt
            args["negative_prompt"] = negative_prompt
        with self.lock, torch.inference_mode():
            generator = torch.Generator(device="cpu").manual_seed(seed)
            pixels = self.pipeline(**args, true_cfg_scale=guidance, generator=generator).images[0]
        buffer = io.BytesIO()
        Image.fromarray((np.clip(pixels, 0, 1) * 255).round().astype(np.uint8)).save(buffer, format="PNG")
        return buffer.getvalue()
