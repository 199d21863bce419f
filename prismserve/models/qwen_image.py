"""Qwen-Image (diffusers `QwenImagePipeline`): a Qwen2.5-VL text encoder, a DiT and a VAE.

Split: the text encoder runs alone and hands the DiT the prompt's last hidden states (`[tokens,
hidden]`, the template's system prefix dropped) and, for classifier-free guidance, the negative
prompt's; the generator (DiT + scheduler + VAE) denoises from those. The pipeline's own code runs on
both sides, so the split computes what the whole pipeline computes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from prismserve.models.base import LOADING, as_numpy, default_device, quiet_transformers
from prismserve.offline import disable_telemetry


class QwenImage:
    """Qwen-Image: `encode_prompt` on the text encoder, `generate` on the DiT + VAE, or both (monolith)."""

    family = "qwen-image"

    def __init__(self, path: str, device: str | None = None, dtype: str = "auto") -> None:
        disable_telemetry()
        quiet_transformers()
        self.path = path
        self.device = device or default_device()
        self.dtype = dtype
        self.pipeline: Any = None

    def _load(self, **without: None) -> None:
        import threading

        from diffusers import QwenImagePipeline
        from diffusers.utils import logging

        logging.disable_progress_bar()
        # `auto`: each component's saved dtype on a GPU; diffusers' default, float32, on a CPU (a
        # pipeline has no one dtype to read: docs/serving.md).
        if self.dtype != "auto":
            import torch

            dtype = {"torch_dtype": getattr(torch, self.dtype)}
        else:
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
        return self.encode_prompts([prompt])[0]

    def encode_prompts(self, prompts: list[str]) -> list[np.ndarray]:
        """Each prompt's conditioning `[tokens, hidden]` (float32), encoded in one batch (padded to
        the longest; each keeps its own tokens)."""
        import torch

        with self.lock, torch.inference_mode():
            embeds, mask = self.pipeline.encode_prompt(prompts, device=self.device)
        if mask is None:  # no padding
            return [as_numpy(e) for e in embeds]
        return [as_numpy(e[m.bool()]) for e, m in zip(embeds, mask, strict=True)]

    def generate(self, prompt: str | None = None, embeds: np.ndarray | None = None, **options: Any) -> bytes:
        """A PNG image from a prompt (monolith) or its conditioning (split): one `Painting` alone."""
        return self.paint([Painting(prompt=prompt, embeds=embeds, **options)])[0]

    def paint(self, paintings: list[Painting]) -> list[bytes]:
        """PNG images of paintings of one kind (`Painting.kind`), in one pipeline call: the prompts
        (or conditionings, padded to the longest and masked) batched, each image from its own seed."""
        import torch
        from PIL import Image

        first = paintings[0]
        if any(p.kind != first.kind for p in paintings):
            raise ValueError("paintings of different sizes, steps or guidance cannot share a batch")
        args: dict[str, Any] = {
            "width": first.width,
            "height": first.height,
            "num_inference_steps": first.steps,
            "true_cfg_scale": first.guidance,
            "output_type": "np",
        }
        with torch.inference_mode():
            if first.embeds is not None:
                args["prompt_embeds"], args["prompt_embeds_mask"] = self._padded(
                    [p.embeds for p in paintings]
                )
                if first.negative is not None:
                    args["negative_prompt_embeds"], args["negative_prompt_embeds_mask"] = self._padded(
                        [p.negative for p in paintings]
                    )
            else:
                args["prompt"] = [p.prompt for p in paintings]
                if first.negative_prompt is not None:
                    args["negative_prompt"] = [p.negative_prompt for p in paintings]
            generators = [torch.Generator(device="cpu").manual_seed(p.seed) for p in paintings]
            with self.lock:
                images = self.pipeline(**args, generator=generators).images
        pngs = []
        for pixels in images:
            buffer = io.BytesIO()
            Image.fromarray((np.clip(pixels, 0, 1) * 255).round().astype(np.uint8)).save(buffer, format="PNG")
            pngs.append(buffer.getvalue())
        return pngs

    def _padded(self, conditionings: list[Any]) -> tuple[Any, Any]:
        """`[n, longest, hidden]` conditionings zero-padded on the right and their `[n, longest]` masks."""
        import torch

        dtype = self.pipeline.transformer.dtype
        parts = [torch.tensor(np.asarray(c)) for c in conditionings]
        longest = max(len(p) for p in parts)
        embeds = torch.stack([torch.nn.functional.pad(p, (0, 0, 0, longest - len(p))) for p in parts])
        mask = torch.stack([torch.arange(longest) < len(p) for p in parts]).long()
        return embeds.to(self.device, dtype), mask.to(self.device)


@dataclass
class Painting:
    """One image to paint: from a prompt (monolith) or its conditioning (split; the negative
    conditioning for guidance), at a size, a number of steps and a guidance scale (its `kind`: what
    paintings sharing a batch have in common) from a seed."""

    width: int
    height: int
    steps: int
    seed: int
    guidance: float = 4.0
    prompt: str | None = None
    negative_prompt: str | None = None
    embeds: Any = None
    negative: Any = None

    @property
    def kind(self) -> tuple[Any, ...]:
        """What a batch's paintings share: size, steps, guidance, and which inputs they come with."""
        return (
            self.width,
            self.height,
            self.steps,
            self.guidance,
            self.embeds is None,
            self.negative is None,
            self.negative_prompt is None,
        )
