"""Audio (wav, mp3, flac, ogg) and video (MP4, WebM) decoded by PyAV: the sound's frequency survives
resampling, and clips reach Qwen2.5-VL's video encoder with the frames its processor would sample."""

from __future__ import annotations

import numpy as np
import pytest
from media_clips import audio_clip, sine, video_clip

from prismserve.models import MediaError, adapter_for
from prismserve.models.media import load_audio, load_video_frames, resample, video_frame_count


def _peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "ogg"])
def test_audio_formats_decode_to_the_same_tone_at_16k(fmt):
    samples = load_audio(audio_clip(fmt, frequency=1000.0, seconds=1.0), 16_000)
    assert samples.dtype == np.float32 and abs(len(samples) - 16_000) < 1200  # codec padding at most
    assert _peak_hz(samples, 16_000) == pytest.approx(1000.0, abs=2)
    assert 0.4 < np.abs(samples).max() < 0.6  # stereo averaged, not summed


def test_resampling_keeps_the_frequency_and_filters_what_cannot_be_kept():
    tone = sine(3000.0, 44_100, 1.0)
    down = resample(tone, 44_100, 16_000)
    assert len(down) == 16_000 and _peak_hz(down, 16_000) == pytest.approx(3000.0, abs=2)
    # 10 kHz is above 16 kHz's Nyquist: filtered out, not folded back to 6 kHz.
    alias = resample(sine(10_000.0, 44_100, 1.0), 44_100, 16_000)
    assert np.sqrt(np.mean(alias**2)) < 0.01 * np.sqrt(np.mean(down**2))
    assert resample(tone, 44_100, 44_100) is tone


def test_undecodable_audio_is_a_media_error():
    with pytest.raises(MediaError, match="not a decodable audio clip"):
        load_audio(b"ID3 not really an mp3", 16_000)


@pytest.mark.parametrize(
    "total, fps, expected",
    [(40, 10, 8), (6, 10, 4), (300, 10, 16), (3, 10, 2), (7, 1, 6)],
)
def test_frame_count_follows_qwen2_vl_sampling(total, fps, expected):
    # transformers' Qwen2VLVideoProcessor.sample_frames(fps=2, min_frames=4, max_frames=16, temporal 2):
    # total / fps * 2, clamped to [4, floor(min(16, total) / 2) * 2] and total, floored to even.
    assert video_frame_count(total, fps, sample_fps=2.0, min_frames=4, max_frames=16, factor=2) == expected


@pytest.mark.parametrize("fmt", ["mp4", "webm"])
def test_video_frames_are_those_the_processor_picks(fmt):
    frames, interval = load_video_frames(video_clip(fmt, 40, fps=10), 16)
    # 4 s at 2 fps: 8 frames at indices arange(0, 40, 40 / 8) = 0, 5, …, 35; each clip frame i is
    # coloured red = i * 37 % 256.
    assert len(frames) == 8 and interval == pytest.approx(0.5)
    reds = [np.asarray(frame)[..., 0].mean() for frame in frames]
    np.testing.assert_allclose(reds, [i * 37 % 256 for i in range(0, 40, 5)], atol=12)


def test_undecodable_video_is_a_media_error():
    with pytest.raises(MediaError, match="not a decodable video clip"):
        load_video_frames(b"\x00\x00\x00\x18ftypmp42 but nothing after", 16)


@pytest.fixture(scope="module")
def vl_encoder(tiny_vl):
    encoder = adapter_for(tiny_vl)
    encoder.load_encoder("video")
    return encoder


@pytest.mark.parametrize("fmt, frames, grid_t", [("mp4", 40, 4), ("webm", 6, 2), ("mp4", 300, 8)])
def test_mp4_and_webm_reach_the_video_encoder(vl_encoder, fmt, frames, grid_t):
    (encoded,) = vl_encoder.encode("video", [video_clip(fmt, frames, fps=10)])
    # grid_t = sampled frames / temporal patch 2: 40 -> 8 frames, 6 -> 4 (min_frames), 300 -> 16 (cap).
    count = 2 * grid_t
    assert encoded.meta["grid_thw"][0] == grid_t
    assert encoded.meta["second_per_grid"] == pytest.approx(2 * frames / 10 / count)
    assert np.isfinite(encoded.embeddings).all() and len(encoded.embeddings) > 0
