"""Audio and video clips made with PyAV for the media tests: sines in a container, coloured frames."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

AUDIO_CODECS = {"wav": ("wav", "pcm_s16le"), "mp3": ("mp3", "libmp3lame"), "flac": ("flac", "flac"),
                "ogg": ("ogg", "libopus")}  # fmt: skip
VIDEO_CODECS = {"mp4": ("mp4", "mpeg4"), "webm": ("webm", "libvpx")}


def sine(frequency: float, rate: int, seconds: float) -> np.ndarray:
    """A float32 sine at half amplitude."""
    return (0.5 * np.sin(2 * np.pi * frequency * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


def audio_clip(fmt: str, frequency: float = 440.0, rate: int = 44_100, seconds: float = 1.0) -> bytes:
    """A stereo sine in `fmt` (wav, mp3, flac or ogg/Opus; Opus at 48 kHz, the only rate it codes)."""
    import av

    container_format, codec = AUDIO_CODECS[fmt]
    rate = 48_000 if codec == "libopus" else rate
    samples = sine(frequency, rate, seconds)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as out:
        stream = out.add_stream(codec, rate=rate, layout="stereo")
        step = stream.codec_context.frame_size or 1024
        sample_format = stream.codec_context.format.name
        for start in range(0, len(samples), step):
            chunk = samples[start : start + step]
            frame = av.AudioFrame.from_ndarray(np.stack([chunk, chunk]), format="fltp", layout="stereo")
            frame.sample_rate, frame.pts = rate, start
            for converted in av.AudioResampler(format=sample_format, layout="stereo", rate=rate).resample(
                frame
            ):
                out.mux(stream.encode(converted))
        out.mux(stream.encode(None))
    return buffer.getvalue()


def video_clip(fmt: str, frames: int, fps: int = 10, size: tuple[int, int] = (64, 48)) -> bytes:
    """`frames` frames at `fps`, each a different colour, in `fmt` (mp4 or webm)."""
    import av

    container_format, codec = VIDEO_CODECS[fmt]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as out:
        _mux_frames(out, codec, frames, fps, size)
    return buffer.getvalue()


def _mux_frames(out, codec: str, frames: int, fps: int, size: tuple[int, int]) -> None:
    """Write `frames` frames at `fps` into the container `out`, each a different colour."""
    import av

    stream = out.add_stream(codec, rate=fps)
    stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
    stream.time_base = Fraction(1, fps)
    for i in range(frames):
        rgb = np.full((size[1], size[0], 3), (i * 37 % 256, 255 - i * 23 % 256, 90), np.uint8)
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        frame.pts = i
        out.mux(stream.encode(frame))
    out.mux(stream.encode(None))


def video_with_sound(
    frames: int, fps: int = 10, size: tuple[int, int] = (64, 48), frequency: float = 330.0, rate: int = 16_000
) -> bytes:
    """An MP4 of `frames` coloured frames at `fps` and a mono sine soundtrack as long (AAC)."""
    import av

    buffer = io.BytesIO()
    samples = sine(frequency, rate, frames / fps)
    with av.open(buffer, "w", format="mp4") as out:
        audio = out.add_stream("aac", rate=rate, layout="mono")
        _mux_frames(out, "mpeg4", frames, fps, size)
        step = audio.codec_context.frame_size or 1024
        resampler = av.AudioResampler(format=audio.codec_context.format.name, layout="mono", rate=rate)
        for start in range(0, len(samples), step):
            chunk = av.AudioFrame.from_ndarray(
                samples[None, start : start + step], format="flt", layout="mono"
            )
            chunk.sample_rate, chunk.pts = rate, start
            for converted in resampler.resample(chunk):
                out.mux(audio.encode(converted))
        out.mux(audio.encode(None))
    return buffer.getvalue()
