"""Media at the API boundary: data URLs, http(s) fetches under a `MediaPolicy`, image, audio and
video checks, WAV encoding."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import io
import ipaddress
import re
import socket
import ssl
import struct
import wave
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from prismserve.errors import InvalidRequestError, PayloadTooLargeError

_DATA_URL = re.compile(
    r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]+)*?);base64,(?P<data>.*)$", re.S
)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "webm", "m4a", "aac")
"""What `input_audio.format` may say; the clip itself is decoded by whatever container PyAV detects."""
_VIDEO_MIMES = ("video/", "image/gif", "image/webp", "image/png", "image/apng")
"""Content types a fetched video may have (a server may send an APNG as image/png)."""
_VIDEO_DATA_MIMES = ("video/", "image/gif", "image/webp", "image/apng")
"""Types a video data URL may name (not image/png: a still image sent as a video is a mistake)."""


@dataclass(frozen=True)
class MediaPolicy:
    """How the gateway fetches `http(s)` media URLs: from which hosts, how many bytes, for how long.

    `allowed_domains` None fetches from any host with a public address; a tuple fetches only from
    the hosts it names (exact, case-insensitive), and a listed host may be private (so a gateway can
    be told to trust an internal media server); an empty tuple fetches nothing. Defaults follow
    vLLM's (a 10 s timeout; 32 MiB, above its 25 MB audio cap).
    """

    allowed_domains: tuple[str, ...] | None = None
    max_bytes: int = 32 << 20
    timeout_s: float = 10.0
    max_redirects: int = 5

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.timeout_s <= 0 or self.max_redirects < 0:
            raise ValueError(f"MediaPolicy needs positive limits, not {self}")
        if self.allowed_domains is not None:
            domains = tuple(d.strip().lower().rstrip(".") for d in self.allowed_domains)
            object.__setattr__(self, "allowed_domains", domains)


def decode_base64(text: str, what: str) -> bytes:
    """Bytes of base64 `text`; a 400 naming `what` if it is not base64."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"{what} is not valid base64") from None


def is_http_url(url: str) -> bool:
    """Whether `url` is one the gateway fetches (rather than a data URL)."""
    return url[:8].lower().startswith(("http://", "https://"))


async def image_from_url(url: str, index: int, policy: MediaPolicy) -> tuple[bytes, str]:
    """(bytes, mime type) of an image given as a base64 data URL or an http(s) URL (whether the image
    decodes is checked later)."""
    what = f"image #{index}"
    if is_http_url(url):
        data, mime = await fetch(url, policy, what)
        return data, mime if mime.startswith("image/") else "image/png"
    match = _DATA_URL.match(url)
    if match is None:
        raise InvalidRequestError(
            f"{what}: expected an http(s) URL or a data URL like data:image/png;base64,…"
        )
    return decode_base64(match["data"], what), match["mime"] or "image/png"


async def video_from_url(url: str, index: int, policy: MediaPolicy) -> tuple[bytes, str]:
    """(bytes, mime type) of a video given as a base64 data URL of a video/* type (or an animated
    image/gif, image/webp or image/apng) or an http(s) URL serving one (MP4, WebM, animated GIF/WebP …).

    The gateway checks the container type and that the clip is not empty; decoding frames is the
    video encoder's job.
    """
    what = f"video #{index}"
    if is_http_url(url):
        data, mime = await fetch(url, policy, what)
        mime = mime if mime.startswith(_VIDEO_MIMES) else _sniffed_video_mime(data)
        if not mime:
            raise InvalidRequestError(f"{what}: {_shown(url)} is not a video (MP4, WebM, GIF or WebP)")
    else:
        match = _DATA_URL.match(url)
        if match is None or not (match["mime"] or "").startswith(_VIDEO_DATA_MIMES):
            raise InvalidRequestError(
                f"{what}: expected an http(s) URL or a data URL like data:video/mp4;base64,…",
            )
        data, mime = decode_base64(match["data"], what), match["mime"]
    if not data:
        raise InvalidRequestError(f"{what} is empty")
    return data, mime


async def audio_from_url(url: str, index: int, policy: MediaPolicy) -> tuple[bytes, str]:
    """(bytes, format) of an `audio_url` part: an http(s) URL or a base64 data URL of an audio/* type;
    the format is the container PyAV detects (checked again with the rest of the request)."""
    what = f"audio #{index}"
    if is_http_url(url):
        data, _ = await fetch(url, policy, what)
    else:
        match = _DATA_URL.match(url)
        if match is None:
            raise InvalidRequestError(
                f"{what}: expected an http(s) URL or a data URL like data:audio/wav;base64,…"
            )
        data = decode_base64(match["data"], what)
    return data, _audio_format(data, what)


async def fetch(url: str, policy: MediaPolicy, what: str) -> tuple[bytes, str]:
    """(body, content type) of a GET of `url` under `policy`: every hop's host allowed and public
    (or listed), at most `max_bytes` read, within `timeout_s`; a 4xx naming `what` otherwise."""
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _fetch(url, policy, what)
    except TimeoutError:
        raise InvalidRequestError(
            f"{what}: fetching {_shown(url)} took longer than {policy.timeout_s:g} s"
        ) from None
    except httpx.HTTPError:
        raise InvalidRequestError(f"{what}: fetching {_shown(url)} failed (connection error)") from None


async def _fetch(url: str, policy: MediaPolicy, what: str) -> tuple[bytes, str]:
    async with httpx.AsyncClient(
        verify=_ssl_context(), trust_env=False, follow_redirects=False, timeout=policy.timeout_s
    ) as client:
        for _ in range(policy.max_redirects + 1):
            target = _parsed(url, what)
            addresses = await _checked_addresses(target, policy, what)
            async with _get(client, target, addresses) as response:
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    url = str(target.join(response.headers["location"]))
                    continue
                if not response.is_success:
                    raise InvalidRequestError(
                        f"{what}: fetching {_shown(url)} failed: the server answered HTTP {response.status_code}"
                    )
                data = await _limited_body(response, policy.max_bytes, what, url)
                return data, response.headers.get("content-type", "").split(";")[0].strip().lower()
        raise InvalidRequestError(f"{what}: {_shown(url)} redirects more than {policy.max_redirects} times")


@contextlib.asynccontextmanager
async def _get(
    client: httpx.AsyncClient, target: httpx.URL, addresses: list[str]
) -> AsyncIterator[httpx.Response]:
    """The streamed response of a GET of `target` from the first of `addresses` that connects.

    It connects to an address already checked (not to a second DNS answer), naming the host in Host
    and TLS SNI, so a host cannot resolve to a public address for the check and a private one for
    the fetch.
    """
    headers = {"Host": target.netloc.decode("ascii"), "Accept-Encoding": "identity"}
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    for address in addresses:
        request = client.build_request(
            "GET", target.copy_with(host=address), headers=headers, extensions=extensions
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.ConnectError:
            if address == addresses[-1]:
                raise
            continue
        try:
            yield response
        finally:
            await response.aclose()
        return


def _parsed(url: str, what: str) -> httpx.URL:
    try:
        target = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        raise InvalidRequestError(f"{what}: {_shown(url)} is not a valid URL") from None
    if target.scheme not in ("http", "https") or not target.host:
        raise InvalidRequestError(f"{what}: {_shown(url)} is not an http(s) URL with a host")
    return target


async def _checked_addresses(target: httpx.URL, policy: MediaPolicy, what: str) -> list[str]:
    """The addresses to connect to for `target`: a 400 if its host is not allowed, or if it resolves
    to a private, loopback, link-local or reserved address and the allow-list does not name it."""
    host = target.host.lower().rstrip(".")
    listed = policy.allowed_domains is not None and host in policy.allowed_domains
    if policy.allowed_domains is not None and not listed:
        raise InvalidRequestError(
            f"{what}: fetching from {host!r} is not allowed; this server fetches media only from "
            f"{', '.join(policy.allowed_domains) or 'no domain'} (--allowed-media-domains)"
        )
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise InvalidRequestError(f"{what}: the host {host!r} could not be resolved") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not listed and not all(_is_public(a) for a in addresses):
        raise InvalidRequestError(
            f"{what}: {host!r} is a private, loopback or reserved address, which this server does not "
            "fetch from unless --allowed-media-domains names it"
        )
    return list(dict.fromkeys(str(address) for address in addresses))


def _is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


async def _limited_body(response: httpx.Response, max_bytes: int, what: str, url: str) -> bytes:
    """The body, read until `max_bytes` and no further (a 413 past it)."""
    too_big = PayloadTooLargeError(
        f"{what}: {_shown(url)} is larger than the {max_bytes} bytes this server fetches; send a smaller file"
    )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_big
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > max_bytes:
            raise too_big
    return bytes(body)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Built once: creating a context loads the CA bundle, which costs more than a small fetch.
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _shown(url: str) -> str:
    return url if len(url) <= 120 else url[:117] + "..."


def _sniffed_video_mime(data: bytes) -> str:
    """The mime type of a video container recognised by its first bytes, or "" if none is."""
    if data[4:8] == b"ftyp":
        return "video/mp4"
    if data[:4] == b"\x1aE\xdf\xa3":
        return "video/webm"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return ""


def _audio_format(data: bytes, what: str) -> str:
    """The audio container PyAV detects in `data`, as an `input_audio.format` name."""
    import av

    try:
        with av.open(io.BytesIO(data), "r") as container:
            names = container.format.name.split(",")
    except (av.FFmpegError, OSError, ValueError):
        raise InvalidRequestError(f"{what} could not be decoded as audio (wav, mp3, flac or ogg)") from None
    for name in names:
        if name in AUDIO_FORMATS:
            return name
    return {"mov": "m4a", "mp4": "m4a", "matroska": "webm"}.get(names[0], names[0])


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
    """A 400 unless `data` is an audio clip PyAV decodes, with samples, in a format named `fmt`
    (one of `AUDIO_FORMATS`, or the container PyAV detects)."""
    import av

    try:
        with av.open(io.BytesIO(data), "r") as container:
            names = container.format.name.split(",")
            if not container.streams.audio:
                raise InvalidRequestError(f"audio #{index} holds no audio stream")
            if next(container.decode(audio=0), None) is None:
                raise InvalidRequestError(f"audio #{index} has no samples")
    except InvalidRequestError:
        raise
    except (av.FFmpegError, OSError, ValueError, EOFError):
        raise InvalidRequestError(
            f"audio #{index} could not be decoded as {fmt.upper()}; send wav, mp3, flac or ogg"
        ) from None
    if fmt not in AUDIO_FORMATS and fmt not in names:
        raise InvalidRequestError(
            f"audio #{index}: format {fmt!r} is not supported; send {', '.join(AUDIO_FORMATS)}"
        )


def check_soundtrack(data: bytes, index: int) -> None:
    """A 400 unless the video `data` holds an audio stream (what `use_audio_in_video` sends)."""
    import av

    try:
        with av.open(io.BytesIO(data), "r") as container:
            if container.streams.audio:
                return
    except (av.FFmpegError, OSError, ValueError, EOFError):
        raise InvalidRequestError(f"video #{index} could not be read as a video container") from None
    raise InvalidRequestError(
        f"video #{index} has no soundtrack, which use_audio_in_video asks for: "
        "send it without mm_processor_kwargs.use_audio_in_video"
    )


def wav_bytes(pcm16: bytes, sample_rate: int) -> bytes:
    """A mono 16-bit WAV file holding `pcm16`."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm16[: len(pcm16) - len(pcm16) % 2])
    return buffer.getvalue()


_ENCODERS: dict[str, tuple[str, str, str]] = {
    "mp3": ("mp3", "libmp3lame", "audio/mpeg"),
    "flac": ("flac", "flac", "audio/flac"),
    "opus": ("ogg", "libopus", "audio/ogg"),
    "aac": ("adts", "aac", "audio/aac"),
}
"""Compressed audio formats: name -> (PyAV container, encoder, content type)."""

AUDIO_CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "pcm16": "audio/pcm"} | {
    fmt: content_type for fmt, (_, _, content_type) in _ENCODERS.items()
}
"""The content type of each format `encode_audio` writes."""


def encode_audio(pcm16: bytes, sample_rate: int, fmt: str) -> bytes:
    """Mono 16-bit PCM at `sample_rate` as a `fmt` file (a key of AUDIO_CONTENT_TYPES).

    `pcm16`/`pcm` is the samples as they are, `wav` a WAV file of them; the compressed formats are
    encoded with PyAV at `sample_rate`, or the nearest higher rate the encoder takes (Opus: 8, 12,
    16, 24 or 48 kHz).
    """
    pcm16 = pcm16[: len(pcm16) - len(pcm16) % 2]
    if fmt in ("pcm16", "pcm"):
        return pcm16
    if fmt == "wav":
        return wav_bytes(pcm16, sample_rate)
    buffer = io.BytesIO()
    output, stream = _open_encoder(buffer, fmt, sample_rate)
    with output:
        if pcm16:
            output.mux(stream.encode(_pcm_frame(pcm16, sample_rate)))
        output.mux(stream.encode(None))
    return buffer.getvalue()


class _Sink:
    """A write-only file for PyAV: what the muxer wrote since the last `take` (not seekable, so
    the muxer writes as it goes, as to a socket)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def take(self) -> bytes:
        data, self.data = bytes(self.data), bytearray()
        return data


STREAM_IO_BYTES = 4096
"""The muxer's write buffer in a streamed answer (FFmpeg also writes out after each packet to an
output it cannot seek)."""


class AudioStreamEncoder:
    """Mono 16-bit PCM arriving in chunks, written out as one `fmt` file (a key of
    AUDIO_CONTENT_TYPES) piece by piece: what each chunk adds, as soon as the format lets it go.

    `rate` resamples the output (statefully: no seam between chunks); None keeps the input's. A
    streamed WAV's header cannot know the length: its sizes are 0xFFFFFFFF, which players read as
    "to the end of the stream", as streaming TTS servers send it.
    """

    def __init__(self, fmt: str, rate: int | None = None) -> None:
        if fmt not in AUDIO_CONTENT_TYPES:
            raise ValueError(f"no audio format {fmt!r}; there are {sorted(AUDIO_CONTENT_TYPES)}")
        self.fmt, self.rate = fmt, rate
        self._resampler: Any = None
        self._output: Any = None
        self._stream: Any = None
        self._sink = _Sink()
        self._started = False

    def _start(self, sample_rate: int) -> bytes:
        import av

        self._started = True
        rate = self.rate or sample_rate
        if self.fmt not in _ENCODERS:
            if rate != sample_rate:
                self._resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
            return _streamed_wav_header(rate) if self.fmt == "wav" else b""
        self._output, self._stream = _open_encoder(self._sink, self.fmt, rate, streamed=True)
        return b""

    def feed(self, pcm16: bytes, sample_rate: int) -> bytes:
        """The bytes of the file that `pcm16` (at `sample_rate`) adds."""
        head = b"" if self._started else self._start(sample_rate)
        pcm16 = pcm16[: len(pcm16) - len(pcm16) % 2]
        if not pcm16:
            return head
        if self._output is None and self._resampler is None:
            return head + pcm16
        frame = _pcm_frame(pcm16, sample_rate)
        if self._output is None:
            return head + b"".join(f.to_ndarray().tobytes() for f in self._resampler.resample(frame))
        self._output.mux(self._stream.encode(frame))
        return head + self._sink.take()

    def finish(self) -> bytes:
        """The file's last bytes (the encoder's flush, the container's trailer)."""
        head = b"" if self._started else self._start(self.rate or 24000)
        if self._resampler is not None:
            return head + b"".join(f.to_ndarray().tobytes() for f in self._resampler.resample(None))
        if self._output is None:
            return head
        self._output.mux(self._stream.encode(None))
        self._output.close()
        return head + self._sink.take()


STREAM_OGG_PAGE_US = "100000"
"""A streamed Ogg's page length (µs): Ogg holds packets back until a page is full, a second by
default, which would delay streamed Opus by as much."""


def _open_encoder(file: Any, fmt: str, rate: int, streamed: bool = False) -> tuple[Any, Any]:
    """A PyAV output container of compressed `fmt` writing to `file`, and its mono audio stream at
    `rate`, or the nearest higher rate the encoder takes (Opus: 8, 12, 16, 24 or 48 kHz).
    `streamed`: written out as each packet is muxed, with short Ogg pages."""
    import av

    container, encoder, _ = _ENCODERS[fmt]
    rates = av.Codec(encoder, "w").audio_rates
    rate = rate if not rates or rate in rates else _rate_for(rate, rates)
    options = {"page_duration": STREAM_OGG_PAGE_US} if streamed and container == "ogg" else {}
    output = av.open(
        file,
        "w",
        format=container,
        container_options=options,
        buffer_size=STREAM_IO_BYTES if streamed else 32768,
    )
    return output, output.add_stream(encoder, rate=rate, layout="mono")


def _pcm_frame(pcm16: bytes, sample_rate: int) -> Any:
    """A PyAV frame of mono 16-bit PCM."""
    import av
    import numpy as np

    frame = av.AudioFrame.from_ndarray(
        np.frombuffer(pcm16, dtype="<i2").reshape(1, -1), format="s16", layout="mono"
    )
    frame.sample_rate = sample_rate
    return frame


def _streamed_wav_header(rate: int) -> bytes:
    """A mono 16-bit WAV header whose RIFF and data sizes say "unknown" (0xFFFFFFFF)."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVEfmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + (b"data" + struct.pack("<I", unknown))
    )


def _rate_for(sample_rate: int, rates: Iterable[int]) -> int:
    # The lowest rate above the samples' (no detail lost), else the highest there is.
    above = [rate for rate in rates if rate >= sample_rate]
    return min(above) if above else max(rates)


def decode_audio(data: bytes, what: str) -> tuple[bytes, int]:
    """(mono 16-bit PCM, sample rate) of an audio file in any format PyAV reads (WAV, MP3, FLAC,
    Ogg/Opus, M4A, WebM …); a 400 naming `what` when it does not decode or holds no samples."""
    import av

    pcm, rate = bytearray(), 0
    try:
        with av.open(io.BytesIO(data), "r") as source:
            if not source.streams.audio:
                raise InvalidRequestError(f"{what} holds no audio stream")
            stream = source.streams.audio[0]
            rate = stream.codec_context.sample_rate or 0
            resampler = av.AudioResampler(format="s16", layout="mono", rate=rate or None)
            for frame in source.decode(stream):
                for mono in resampler.resample(frame):
                    pcm += mono.to_ndarray().tobytes()
            for mono in resampler.resample(None):
                pcm += mono.to_ndarray().tobytes()
    except av.FFmpegError as exc:
        reason = exc.strerror or str(exc)
        raise InvalidRequestError(
            f"{what} could not be decoded as audio ({reason}): send WAV, MP3, FLAC, Ogg/Opus, M4A or WebM"
        ) from None
    if not pcm or not rate:
        raise InvalidRequestError(f"{what} holds no audio samples")
    return bytes(pcm), rate
