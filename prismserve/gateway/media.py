"""Media at the API boundary: data URLs, image and audio checks, WAV encoding."""

from __future__ import annotations

import base64
import binascii
import io
import re
import wave

from prismserve.errors import InvalidRequestError

_DATA_URL = re.compile(
    r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]+)*?);base64,(?P<data>.*)$", re.S
)


def decode_base64(text: str, what: str) -> bytes:
    """Bytes of base64 `text`; a 400 naming `what` if it is not base64."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"{what} is not valid base64") from None


def image_from_url(url: str, index: int) -> tuple[bytes, str]:
    """(bytes, mime type) of an image given as a base64 data URL (whether the image decodes is checked later)."""
    match = _DATA_URL.match(url)
    if match is None:
        if url.startswith(("http://", "https://")):
            raise InvalidRequestError(
                f"image #{index}: only data: URLs are accepted (the server fetches nothing)"
            )
        raise InvalidRequestError(f"image #{index}: expected a data URL like data:image/png;base64,…")
    return decode_base64(match["data"], f"image #{index}"), match["mime"] or "image/png"


def video_from_url(url: str, index: int) -> tuple[bytes, str]:
    """(bytes, mime type) of a video given as a base64 data URL of a video/* type (or an animated image/gif).

    The gateway checks the container type and that the clip is not empty; decoding frames is the
    video encoder's job (no codec library is a gateway dependency).
    """
    match = _DATA_URL.match(url)
    if match is None or not (match["mime"] or "").startswith(("video/", "image/gif")):
        raise InvalidRequestError(
            f"video #{index}: expected a data URL like data:video/mp4;base64,… (the server fetches nothing)",
        )
    data = decode_base64(match["data"], f"video #{index}")
    if not data:
        raise InvalidRequestError(f"video #{index} is empty")
    return data, match["mime"]


def check_image(data: bytes, index: int) -> None:
    """A 400 unless `data` is an image PIL can decode, of no more pixels than PIL decodes safely."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except Image.DecompressionBombError as exc:  # its header claims more pixels than memory should hold
        raise InvalidRequestError(
            f"image #{index} is too large to decode: {exc} Send a smaller image."
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InvalidRequestError(f"image #{index} could not be decoded: {exc}") from None


def check_audio(data: bytes, fmt: str, index: int) -> None:
    """A 400 unless `data` is a WAV file with at least one sample."""
    if fmt != "wav":
        raise InvalidRequestError(f"audio #{index}: format {fmt!r} is not supported; send wav")
    try:
        with wave.open(io.BytesIO(data)) as clip:
            if clip.getnframes() == 0:
                raise InvalidRequestError(f"audio #{index} has no samples")
    except (wave.Error, EOFError) as exc:
        raise InvalidRequestError(f"audio #{index} could not be decoded as WAV: {exc}") from None


def wav_bytes(pcm16: bytes, sample_rate: int) -> bytes:
    """A mono 16-bit WAV file holding `pcm16`."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm16[: len(pcm16) - len(pcm16) % 2])
    return buffer.getvalue()
