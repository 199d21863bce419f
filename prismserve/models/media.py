"""Decoding media bytes for encoders: images with PIL, audio and video with PyAV (FFmpeg)."""

from __future__ import annotations

import io
from collections.abc import Callable
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
    """Mono float32 samples in [-1, 1] at `sample_rate` from an audio clip PyAV decodes (WAV, MP3,
    FLAC, Ogg …; channels averaged, resampled with soxr)."""
    import av

    chunks, rate = [], 0
    try:
        with av.open(io.BytesIO(data), "r") as container:
            planar = av.AudioResampler(format="fltp")  # float samples, the clip's own layout and rate
            for frame in container.decode(audio=0):
                rate = rate or frame.sample_rate
                chunks += [out.to_ndarray().mean(axis=0) for out in planar.resample(frame)]
            chunks += [out.to_ndarray().mean(axis=0) for out in planar.resample(None)]
    except (av.FFmpegError, OSError, ValueError, EOFError, IndexError) as exc:
        raise MediaError(
            f"not a decodable audio clip ({len(data)} bytes; wav, mp3, flac, ogg): {exc}"
        ) from None
    if not chunks or not rate:
        raise MediaError(f"audio clip of {len(data)} bytes holds no samples")
    return resample(np.concatenate(chunks).astype(np.float32), rate, sample_rate)


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """`samples` at `target` Hz, by soxr's band-limited resampler (no energy above target/2 folds back)."""
    if rate == target:
        return samples
    import soxr

    return soxr.resample(samples, rate, target, quality="HQ").astype(np.float32, copy=False)


def video_frame_count(
    total: int, fps: float, *, sample_fps: float, min_frames: int, max_frames: int, factor: int
) -> int:
    """How many frames of a `total`-frame clip at `fps` Qwen2-VL's video processor keeps
    (`Qwen2VLVideoProcessor.sample_frames` with `fps`): `sample_fps` per second, clamped to
    [`min_frames`, `max_frames`] and the clip's length, a multiple of `factor` (the temporal patch)."""
    ceiling = min(max_frames, total) // factor * factor
    wanted = min(max(total / fps * sample_fps, min_frames), ceiling, total)
    return max(factor, int(wanted // factor * factor))


def load_video_frames(
    data: bytes, max_frames: int, *, fps: float = 2.0, min_frames: int = 4, factor: int = 2
) -> tuple[list[Any], float]:
    """RGB frames of a clip (MP4, WebM … by PyAV; animated GIF, WebP or PNG by PIL), sampled as
    Qwen2-VL's video processor samples them (`video_frame_count` evenly spaced frames), and the
    seconds between two kept frames (1 / the processor's `sampled_fps`)."""
    total, seconds, pick = _clip(data)
    count = video_frame_count(
        total, total / seconds, sample_fps=fps, min_frames=min_frames, max_frames=max_frames, factor=factor
    )
    kept = pick(np.arange(0, total, total / count).astype(int)[:count].tolist())
    kept += kept[-1:] * (count - len(kept))  # a stream that decodes fewer frames than it holds packets
    return kept, seconds / count


Pick = Callable[[list[int]], list[Any]]


def _clip(data: bytes) -> tuple[int, float, Pick]:
    """(frame count, seconds, a function of frame indices giving their RGB images) of a clip."""
    if data[:6] in (b"GIF87a", b"GIF89a") or data[:4] == b"\x89PNG" or data[8:12] == b"WEBP":
        return _image_clip(data)
    return _av_clip(data)


def _image_clip(data: bytes) -> tuple[int, float, Pick]:
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
    return len(frames), seconds, lambda indices: [frames[i][0] for i in indices]


def _av_clip(data: bytes) -> tuple[int, float, Pick]:
    """A video container's first video stream: its frames counted from packets (no decoding), and
    decoded again, keeping only the frames asked for, when picked."""
    import av

    try:
        with av.open(io.BytesIO(data), "r") as container:
            stream = container.streams.video[0]
            _check_frame_size(stream.width, stream.height)
            stamps = [p.pts * p.time_base for p in container.demux(stream) if p.size and p.pts is not None]
            rate = float(stream.average_rate or stream.guessed_rate or 0) or 24.0
    except (av.FFmpegError, OSError, ValueError, EOFError, IndexError) as exc:
        raise _undecodable(data, exc) from None
    if not stamps:
        raise MediaError(f"video clip of {len(data)} bytes holds no frames")
    seconds = float(max(stamps) - min(stamps)) + 1 / rate

    def pick(indices: list[int]) -> list[Any]:
        wanted, kept = set(indices), {}
        try:
            with av.open(io.BytesIO(data), "r") as container:
                for i, frame in enumerate(container.decode(video=0)):
                    if i in wanted:
                        kept[i] = frame.to_image()
                    if i >= indices[-1]:
                        break
        except (av.FFmpegError, OSError, ValueError, EOFError) as exc:
            raise _undecodable(data, exc) from None
        if not kept:
            raise MediaError(f"video clip of {len(data)} bytes decodes to no frames")
        return [kept[i] for i in indices if i in kept]

    return len(stamps), seconds, pick


def _check_frame_size(width: int, height: int) -> None:
    from PIL import Image

    if width * height > (Image.MAX_IMAGE_PIXELS or 1 << 62):
        raise MediaError(f"video frames too large to decode: {width}x{height} pixels. Send a smaller clip.")


def _undecodable(data: bytes, exc: Exception) -> MediaError:
    return MediaError(f"not a decodable video clip ({len(data)} bytes; MP4, WebM, GIF or WebP): {exc}")
