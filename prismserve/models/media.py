"""Decoding media bytes for encoders: images with PIL, WAV audio with the standard library."""

from __future__ import annotations

import io
import wave
from typing import Any

import numpy as np

from prismserve.models.base import MediaError


def load_image(data: bytes) -> Any:
    """A PIL RGB image from encoded bytes (PNG, JPEG …)."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data)).convert("RGB")
    except (
        Image.DecompressionBombError
    ) as exc:  # not an OSError: without this, a 5xx instead of the client's 4xx
        raise MediaError(f"image too large to decode: {exc} Send a smaller image.") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise MediaError(f"not a decodable image ({len(data)} bytes): {exc}") from None


def load_audio(data: bytes, sample_rate: int) -> np.ndarray:
    """Mono float32 samples in [-1, 1] at `sample_rate` from a PCM WAV file (channels averaged)."""
    try:
        with wave.open(io.BytesIO(data)) as clip:
            width, channels, rate = clip.getsampwidth(), clip.getnchannels(), clip.getframerate()
            frames = clip.readframes(clip.getnframes())
    except (wave.Error, EOFError) as exc:
        raise MediaError(f"not a decodable WAV file ({len(data)} bytes): {exc}") from None
    if width not in (1, 2, 4) or not frames:
        raise MediaError(
            f"WAV with {width}-byte samples and {len(frames)} bytes of audio cannot be read; send 8/16/32-bit PCM"
        )
    dtype = {1: np.uint8, 2: np.int16, 4: np.int32}[width]
    samples = np.frombuffer(frames[: len(frames) // (width * channels) * width * channels], dtype).astype(
        np.float32
    )
    if width == 1:
        samples -= 128.0  # 8-bit WAV is unsigned
    samples = samples.reshape(-1, channels).mean(axis=1) / float(2 ** (8 * width - 1))
    return resample(samples, rate, sample_rate)


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """`samples` at `target` Hz: box-filtered then linearly interpolated (enough for speech features)."""
    if rate == target:
        return samples
    if rate > target:  # low-pass before decimating, so that no energy above target/2 folds back
        width = int(round(rate / target))
        samples = np.convolve(samples, np.full(width, 1.0 / width, np.float32), mode="same")
    times = np.arange(int(len(samples) * target / rate)) * (rate / target)
    return np.interp(times, np.arange(len(samples)), samples).astype(np.float32)


def load_video_frames(data: bytes, max_frames: int) -> tuple[list[Any], float]:
    """Up to `max_frames` evenly spaced RGB frames of an animated image (GIF, animated WebP/PNG) and
    the seconds between two of them; an even count (the last repeated if needed), at least two."""
    from PIL import Image, ImageSequence, UnidentifiedImageError

    try:
        clip = Image.open(io.BytesIO(data))
        frames = [
            (frame.convert("RGB"), frame.info.get("duration") or 500)
            for frame in ImageSequence.Iterator(clip)
        ]
    except Image.DecompressionBombError as exc:
        raise MediaError(f"video frames too large to decode: {exc} Send a smaller clip.") from None
    except (UnidentifiedImageError, OSError, EOFError) as exc:
        raise MediaError(
            f"not a decodable video clip ({len(data)} bytes; animated GIF, WebP or PNG): {exc}"
        ) from None
    seconds = sum(duration for _, duration in frames) / 1000
    step = max(1, -(-len(frames) // max_frames))  # ceil: at most max_frames kept
    kept = [frame for frame, _ in frames[::step]]
    if len(kept) % 2:
        kept.append(kept[-1])
    return kept, seconds / max(1, len(frames[::step]))
