"""Qwen2.5-VL: a ViT image encoder (window attention, 2x2 patch merger) and a Qwen2.5 LLM with M-RoPE.

Split: the vision tower (`model.visual`) runs alone on each image or video clip; its merged patch
embeddings (`[grid_t * grid_h * grid_w / merge^2, hidden]`) and the item's `grid_thw` (for a clip
also the seconds per temporal patch) cross to the LLM, which places them at the image- or
video-pad tokens and derives its 3-D rotary positions from them.

Video clips (MP4, WebM … decoded by PyAV; animated GIF, WebP or PNG) are sampled as transformers'
Qwen2-VL video processor samples them with `fps` (`VIDEO_FPS` frames a second, at least
`MIN_VIDEO_FRAMES`, at most `MAX_VIDEO_FRAMES`, an even count) and patchified here, pairs of frames
per temporal patch, as that processor lays them out (it needs torchvision, which does not import
beside the CPU torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prismserve.models.base import Encoded, MediaError, MediaInput, as_numpy, qwen_vllm_embeddings
from prismserve.models.media import load_image, load_video_frames
from prismserve.models.vision_llm import VisionLLM


class Qwen25VL(VisionLLM):
    """Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`)."""

    family = "qwen2.5-vl"
    component_prefixes = {"image": ("visual.", "model.visual."), "video": ("visual.", "model.visual.")}
    model_class = "Qwen2_5_VLForConditionalGeneration"
    processor_class = "Qwen2_5_VLProcessor"

    def keep_encoder(self, model: Any) -> Any:
        return model.model.visual

    def drop_encoder(self, model: Any) -> None:
        del model.model.visual

    def vllm_embeddings(self, items: list[Encoded]) -> Any:
        return qwen_vllm_embeddings(items)

    encoder_modalities = ("image", "video")

    def run_encoder(self, pixels: Any, modality: str = "image") -> list[Encoded]:
        import torch

        grids = pixels[f"{modality}_grid_thw"]
        values = pixels["pixel_values" if modality == "image" else "pixel_values_videos"]
        merged = self.model(values.to(self.device, self.model.dtype), grid_thw=grids.to(self.device))
        sizes = (grids.prod(-1) // self.model.spatial_merge_size**2).tolist()
        parts = torch.split(merged.pooler_output, sizes)
        meta = [{"grid_thw": g.tolist()} for g in grids]
        for m, seconds in zip(meta, pixels.get("second_per_grid_ts", []), strict=False):
            m["second_per_grid"] = float(seconds)
        return [Encoded(modality, as_numpy(p), m) for p, m in zip(parts, meta, strict=True)]

    def video_pixels(self, clips: list[bytes]) -> dict[str, Any]:
        """`pixel_values_videos`, `video_grid_thw` and `second_per_grid_ts` of the clips, in order."""
        return qwen_video_pixels(self.pixels, self.processor.image_processor, clips)

    def raw_video_inputs(self, text: str, media: list[MediaInput]) -> dict[str, Any]:
        import torch

        images = [load_image(m.data) for m in media if m.modality == "image"]
        pixels = {
            **(dict(self.pixels(images)) if images else {}),
            **self.video_pixels([m.data for m in media if m.modality == "video"]),
        }
        merge = self.processor.image_processor.merge_size**2
        counts = {
            modality: iter((pixels[f"{modality}_grid_thw"].prod(-1) // merge).tolist())
            for modality in ("image", "video")
            if f"{modality}_grid_thw" in pixels
        }
        expanded = self.expand(
            text, [(m.modality, self.media_token(m.modality) * next(counts[m.modality])) for m in media]
        )
        inputs = dict(self.tokenizer([expanded], return_tensors="pt"))
        inputs["mm_token_type_ids"] = torch.tensor(
            self.processor.create_mm_token_type_ids(inputs["input_ids"])
        )
        return {k: v.to(self.device) for k, v in {**inputs, **pixels}.items()}

    def encode(self, modality: str, items: list[bytes]) -> list[Encoded]:
        if modality != "video":
            return super().encode(modality, items)
        import torch

        pixels = self.video_pixels(items)
        with self.lock, torch.inference_mode():
            return self.run_encoder(pixels, "video")

    def llm_extras(self, inputs: dict[str, Any], encoded: list[Encoded]) -> dict[str, Any]:
        import torch

        type_ids = self.processor.create_mm_token_type_ids(inputs["input_ids"].cpu())
        extras = {"mm_token_type_ids": torch.tensor(type_ids, device=self.device)}
        for modality in ("image", "video"):
            items = [e for e in encoded if e.modality == modality]
            if items:
                extras[f"{modality}_grid_thw"] = torch.tensor(
                    [e.meta["grid_thw"] for e in items], device=self.device
                )
        videos = [e for e in encoded if e.modality == "video"]
        if videos:
            extras["second_per_grid_ts"] = torch.tensor(
                [e.meta["second_per_grid"] for e in videos], device=self.device
            )
        return extras


MAX_VIDEO_FRAMES = 16  # below the processor's 768: a CPU-sized cap
MIN_VIDEO_FRAMES = 4
VIDEO_FPS = 2.0


def qwen_video_pixels(
    pixels: Callable[[list[Any]], Any], processor: Any, clips: list[bytes]
) -> dict[str, Any]:
    """`pixel_values_videos`, `video_grid_thw` and `second_per_grid_ts` of the clips, in order, as
    Qwen2-VL's video processor makes them (Qwen2.5-VL's and the Qwen-Omni families' vision towers): each
    frame patchified by `pixels` (the image processor, `processor`), pairs of frames per temporal patch."""
    import torch

    values, grids, seconds = [], [], []
    for data in clips:
        frames, interval = load_video_frames(
            data,
            MAX_VIDEO_FRAMES,
            fps=VIDEO_FPS,
            min_frames=MIN_VIDEO_FRAMES,
            factor=processor.temporal_patch_size,
        )
        if len({frame.size for frame in frames}) > 1:
            raise MediaError("video frames of different sizes")
        out = pixels(frames)  # each frame as an image: its patch repeated over the temporal patch
        _, h, w = out["image_grid_thw"][0].tolist()
        size, temporal = processor.patch_size, processor.temporal_patch_size
        x = out["pixel_values"].reshape(len(frames) // temporal, temporal, h * w, 3, temporal, size, size)
        # Patch (C, T, P, P): time step t of a temporal patch from the pair's frame t.
        paired = torch.stack([x[:, t, :, :, t] for t in range(temporal)], dim=3)
        values.append(paired.reshape(len(frames) // temporal * h * w, -1))
        grids.append([len(frames) // temporal, h, w])
        seconds.append(temporal * interval)
    return {
        "pixel_values_videos": torch.cat(values),
        "video_grid_thw": torch.tensor(grids),
        "second_per_grid_ts": torch.tensor(seconds),
    }
