"""Media tokens counted before encoding, from an item's header, the way a model's processor counts them.

Token-aware routing (ModServe, 003 §4.3) sends each media item to the encoder replica with the fewest
pending media tokens and each prompt to the LLM replica with the fewest pending tokens; both need
the count when the request arrives, before any encoder has run. An image's count follows from its
size alone (Qwen-VL's resize to 28-px units, InternVL's 448-px tiles, Gemma 3's fixed count); a
clip's from its length, probed from the container header.
"""

from __future__ import annotations

import io
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from prismserve.task.components import checkpoint_config

# A clip whose header cannot be read counts as this many seconds: an estimate, never a refusal
# (the encoder itself rejects media it cannot decode).
UNKNOWN_CLIP_S = 10.0


def qwen_image_tokens(
    width: int, height: int, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280, factor: int = 28
) -> int:
    """Tokens a Qwen-VL / Qwen-Omni vision encoder makes of an image: the processor resizes it to
    multiples of `factor` px (its patch times its merge: 28, Qwen3's 32) within [`min_pixels`,
    `max_pixels`] (`smart_resize`), one token per `factor` x `factor`."""
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return (h // factor) * (w // factor)


def internvl_tiles(width: int, height: int, max_tiles: int = 12) -> int:
    """448-px tiles InternVL's dynamic tiling cuts an image into, plus the thumbnail tile.

    The grid (i, j) with i·j ≤ max_tiles whose aspect ratio is closest to the image's; ties go to the
    larger grid when the image has more than half its pixels (InternVL's `find_closest_aspect_ratio`).
    """
    aspect = width / height
    grids = sorted(
        {(i, j) for i in range(1, max_tiles + 1) for j in range(1, max_tiles + 1) if i * j <= max_tiles},
        key=lambda g: g[0] * g[1],
    )
    best, best_diff = (1, 1), float("inf")
    for i, j in grids:
        diff = abs(aspect - i / j)
        if diff < best_diff or (diff == best_diff and width * height > 0.5 * 448 * 448 * i * j):
            best, best_diff = (i, j), diff
    tiles = best[0] * best[1]
    return tiles + (1 if tiles > 1 else 0)


class MediaTokens(BaseModel):
    """How a model's processor counts a media item's tokens.

    `image`: `patches` (Qwen-VL, Qwen-Omni: one token per 28x28 px after resizing within
    `min_pixels`..`max_pixels`), `tiles` (InternVL: `tokens_per_tile` per 448-px tile, at most
    `max_tiles` plus a thumbnail) or `fixed` (Gemma 3: `tokens_per_image`). Audio: `audio_per_s`
    tokens a second (Qwen-Omni's audio tower: 25). Video: `video_fps` frames a second, two frames
    per temporal patch, each patch counted as an image of the clip's frame size.
    """

    model_config = ConfigDict(frozen=True)

    image: Literal["patches", "tiles", "fixed"] = "patches"
    min_pixels: int = Field(default=56 * 56, ge=1)
    max_pixels: int = Field(default=28 * 28 * 1280, ge=1)
    max_tiles: int = Field(default=12, ge=1)
    tokens_per_tile: int = Field(default=256, ge=1)
    tokens_per_image: int = Field(default=256, ge=1)
    audio_per_s: float = Field(default=25.0, gt=0)
    video_fps: float = Field(default=2.0, gt=0)
    patch_px: int = Field(default=28, ge=1)  # `patches`: pixels a token's side covers (patch x merge)

    def of_checkpoint(self, model: str) -> MediaTokens:
        """This counting with what it leaves unset read from checkpoint `model`'s processor (its
        `preprocessor_config.json`, local or in the hub cache; as it is where not there): the pixel
        bounds and patch of a `patches` model. vLLM and transformers resize by the checkpoint's
        bounds, not by the defaults here (Qwen's recommended ones): a tiny test checkpoint makes 16
        tokens at most, Qwen2.5-VL-7B up to 16,384."""
        config = checkpoint_config(model, "preprocessor_config.json") if self.image == "patches" else {}
        size = config.get("size")
        size = size if isinstance(size, dict) else {}
        found = {
            "min_pixels": config.get("min_pixels") or size.get("shortest_edge"),
            "max_pixels": config.get("max_pixels") or size.get("longest_edge"),
            "patch_px": config.get("patch_size", 0) * config.get("merge_size", 0),
        }
        unset = {k: v for k, v in found.items() if v and k not in self.model_fields_set}
        return self.model_copy(update=unset) if unset else self

    def count(self, modality: str, data: bytes) -> int:
        """Tokens the item `data` of `modality` becomes; at least 1."""
        if modality == "image":
            size = _image_size(data)
            return self.image_tokens(*size) if size else self.tokens_per_image
        seconds, size = _clip_header(data)
        if modality == "audio":
            return max(1, round(seconds * self.audio_per_s))
        patches = max(1, math.ceil(seconds * self.video_fps / 2))
        return patches * (self.image_tokens(*size) if size else self.tokens_per_image)

    def image_tokens(self, width: int, height: int) -> int:
        """Tokens of an image of `width` x `height` px."""
        if self.image == "patches":
            return qwen_image_tokens(width, height, self.min_pixels, self.max_pixels, self.patch_px)
        if self.image == "tiles":
            return self.tokens_per_tile * internvl_tiles(width, height, self.max_tiles)
        return self.tokens_per_image


def _image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the image's header, or None when it is not an image PIL reads."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as opened:  # reads the header only
            return opened.size
    except Exception:  # noqa: BLE001 - a count, not a check: the encoder refuses what it cannot decode
        return None


def _clip_header(data: bytes) -> tuple[float, tuple[int, int] | None]:
    """(seconds, frame size or None) of an audio or video clip, from its container's header."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            seconds = container.duration / 1_000_000 if container.duration else UNKNOWN_CLIP_S
            video = container.streams.video[0] if container.streams.video else None
            size = (video.codec_context.width, video.codec_context.height) if video is not None else None
            return seconds, size if size and all(size) else None
    except Exception:  # noqa: BLE001 - a count, not a check
        return UNKNOWN_CLIP_S, None
