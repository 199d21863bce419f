"""Request bodies: OpenAI chat completion JSON with real media from ../shared/workloads/media.

Images are media/cars.jpg resized to each request's size, audio is media/query_to_cars.wav, and a
video is a short animated GIF of crops of cars.jpg (the shared media hold no video file).
"""

from __future__ import annotations

import base64
import io
import json
from functools import lru_cache
from pathlib import Path

from prismserve.bench.workloads import RequestSpec, workloads_dir

_WORDS = [
    "the",
    "a",
    "car",
    "street",
    "red",
    "blue",
    "city",
    "photo",
    "what",
    "is",
    "in",
    "this",
    "picture",
    "describe",
    "drive",
    "road",
    "sky",
]


@lru_cache(maxsize=512)
def image_url(root: str, size: tuple[int, int]) -> str:
    """cars.jpg resized to `size` (JPEG) as a data URL."""
    from PIL import Image

    with Image.open(Path(root) / "media" / "cars.jpg") as image:
        resized = image.convert("RGB").resize(size)
    buffer = io.BytesIO()
    resized.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


@lru_cache(maxsize=4)
def audio_base64(root: str) -> str:
    """The spoken question about the cars picture, base64 WAV."""
    return base64.b64encode((Path(root) / "media" / "query_to_cars.wav").read_bytes()).decode()


@lru_cache(maxsize=4)
def video_url(root: str, frames: int = 8) -> str:
    """A short clip panning across cars.jpg (animated GIF, 320x180) as a data URL."""
    from PIL import Image

    with Image.open(Path(root) / "media" / "cars.jpg") as image:
        source = image.convert("RGB")
    step = (source.width - source.height * 16 // 9) // max(1, frames - 1)
    clips = [
        source.crop((i * step, 0, i * step + source.height * 16 // 9, source.height)).resize((320, 180))
        for i in range(frames)
    ]
    buffer = io.BytesIO()
    clips[0].save(buffer, format="GIF", save_all=True, append_images=clips[1:], duration=100, loop=0)
    return "data:image/gif;base64," + base64.b64encode(buffer.getvalue()).decode()


def prompt(tokens: int, start: int = 0) -> str:
    """About `tokens` words of text, from the `start`-th word of its cycle (texts of one length that
    differ: an engine's prefix cache serves none of them from another)."""
    return " ".join(_WORDS[(start + i) % len(_WORDS)] for i in range(tokens))


def chat_body(spec: RequestSpec, model: str, stream: bool = True, root: Path | None = None) -> dict:
    """The OpenAI chat completion request for `spec`."""
    media = str(root or workloads_dir())
    content: list[dict] = [{"type": "text", "text": prompt(spec.text_tokens)}]
    content += [{"type": "image_url", "image_url": {"url": image_url(media, size)}} for size in spec.images]
    content += [
        {"type": "input_audio", "input_audio": {"data": audio_base64(media), "format": "wav"}}
    ] * spec.audios
    content += [{"type": "video_url", "video_url": {"url": video_url(media)}}] * spec.videos
    body: dict = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": spec.output_tokens,
        "stream": stream,
    }
    if spec.audio_out:
        body["modalities"] = ["text", "audio"]
    return body


def encoded_body(spec: RequestSpec, model: str, stream: bool = True, root: Path | None = None) -> bytes:
    """`chat_body` as JSON bytes, ready to send."""
    return json.dumps(chat_body(spec, model, stream, root)).encode()
