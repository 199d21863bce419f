"""Media by http(s) URL in chat requests: fetched under the gateway's MediaPolicy, every refusal a 4xx
naming the part, the gateway serving on afterwards; audio in wav/mp3/flac/ogg checked by PyAV."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest
from gateway_apps import ADMIN, ANSWER, TOKEN, data_url, png, wav
from media_clips import audio_clip, video_clip
from toy.executors import EXECUTORS

from prismserve.errors import InvalidRequestError
from prismserve.gateway import create_gateway
from prismserve.gateway.media import MediaPolicy, fetch
from prismserve.runtime import LocalRuntime

MAX_BYTES = 64 << 10
TAKES_ALL = ANSWER.replace('frozenset({"text", "image"})', 'frozenset({"text", "image", "audio", "video"})')
"""The `answer` app, taking every input modality."""


class _Media(BaseHTTPRequestHandler):
    """GET of the paths in `FILES`; /redirect, /slow (never finishes in time), /big (no length)."""

    files: dict[str, tuple[str, bytes]] = {}
    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.end_headers()
        elif self.path == "/host":  # the Host header it was sent, as its body
            host = (self.headers["Host"] or "").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(host)))
            self.end_headers()
            self.wfile.write(host)
        elif self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.release.wait(10)
        elif self.path == "/big":  # no Content-Length: only streaming can stop it
            self.send_response(200)
            self.send_header("Content-Type", "video/mp4")
            self.end_headers()
            for _ in range(MAX_BYTES // 1024 + 2):
                self.wfile.write(b"\0" * 1024)
        elif self.path in self.files:
            mime, body = self.files[self.path]
            self.send_response(200)
            self.send_header("Content-Type", mime)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def media_server() -> Iterator[str]:
    """Base URL of a local media server (127.0.0.1) holding an image, a clip per audio format and videos."""
    _Media.files = {
        "/cat.png": ("image/png", png()),
        "/clip.mp4": ("video/mp4", video_clip("mp4", 6)),
        "/clip.webm": ("application/octet-stream", video_clip("webm", 6)),  # sniffed
        "/notes.txt": ("text/plain", b"not a video"),
        "/big-declared": ("image/png", b"\0" * (MAX_BYTES + 1)),
        **{
            f"/tone.{fmt}": (f"audio/{fmt}", audio_clip(fmt, seconds=0.2))
            for fmt in ("wav", "mp3", "flac", "ogg")
        },
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Media)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Media.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def policy_gateway(serve_gateway):
    """`with policy_gateway(policy) as chat:` an openai client of a gateway fetching under `policy`."""

    def start(policy: MediaPolicy | None) -> Iterator[openai.OpenAI]:
        app = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN, media=policy)
        with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
            created = client.post("/admin/apps", json={"name": "all", "source": TAKES_ALL}, headers=ADMIN)
            assert created.status_code == 201, created.text
            yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    return contextmanager(start)


@pytest.fixture
def local_chat(policy_gateway):
    """An openai client of a gateway that may fetch from 127.0.0.1 (listed), 64 KiB, 1 s."""
    with policy_gateway(
        MediaPolicy(allowed_domains=("127.0.0.1",), max_bytes=MAX_BYTES, timeout_s=1.0)
    ) as chat:
        yield chat


def _ask(chat: openai.OpenAI, *parts: dict) -> str:
    completion = chat.chat.completions.create(
        model="all", messages=[{"role": "user", "content": list(parts)}], max_tokens=64
    )
    return completion.choices[0].message.content


def _image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _still_serving(chat: openai.OpenAI) -> None:
    assert _ask(chat, {"type": "text", "text": "still here"}).endswith("user: still here")


def test_image_audio_and_video_urls_are_fetched_like_data_urls(local_chat, media_server):
    # The toy encoders embed the bytes: the same answer means the same bytes reached the app.
    assert _ask(local_chat, _image(f"{media_server}/cat.png")) == _ask(local_chat, _image(data_url(png())))
    assert _ask(local_chat, _image(f"{media_server}/redirect")) == _ask(local_chat, _image(data_url(png())))
    for fmt in ("wav", "mp3", "flac", "ogg"):
        fetched = _ask(local_chat, {"type": "audio_url", "audio_url": {"url": f"{media_server}/tone.{fmt}"}})
        inline = _ask(
            local_chat,
            {
                "type": "input_audio",
                "input_audio": {
                    "data": base64.b64encode(_Media.files[f"/tone.{fmt}"][1]).decode(),
                    "format": fmt,
                },
            },
        )
        assert fetched == inline and fetched.startswith("[1 media, ")
    for name in ("clip.mp4", "clip.webm"):
        assert _ask(local_chat, {"type": "video_url", "video_url": {"url": f"{media_server}/{name}"}})


@pytest.mark.parametrize(
    "path, status, message",
    [
        (
            "/missing.png",
            400,
            r"image #0: fetching http://127\.0\.0\.1:\d+/missing\.png failed: the server answered HTTP 404",
        ),
        ("/big", 413, "image #0: .* is larger than the 65536 bytes this server fetches"),
        ("/big-declared", 413, "image #0: .* is larger than the 65536 bytes this server fetches"),
        ("/slow", 400, r"image #0: fetching .*/slow took longer than 1 s"),
        ("/notes.txt", 400, "image #0 could not be decoded"),
    ],
)
def test_fetch_failures_are_4xx_and_the_gateway_keeps_serving(
    local_chat, media_server, path, status, message
):
    with pytest.raises(openai.APIStatusError, match=message) as caught:
        _ask(local_chat, _image(f"{media_server}{path}"))
    assert caught.value.status_code == status
    _still_serving(local_chat)


def test_a_fetched_file_that_is_not_a_video_is_400(local_chat, media_server):
    with pytest.raises(
        openai.BadRequestError, match=r"video #0: http://127\.0\.0\.1:\d+/notes\.txt is not a video"
    ):
        _ask(local_chat, {"type": "video_url", "video_url": {"url": f"{media_server}/notes.txt"}})


@pytest.mark.parametrize(
    "policy, url, message",
    [
        (None, "{server}/cat.png", "image #0: '127.0.0.1' is a private, loopback or reserved address"),
        (
            None,
            "http://localhost:9/cat.png",
            "image #0: 'localhost' is a private, loopback or reserved address",
        ),
        (None, "http://[::1]:9/cat.png", r"image #0: '::1' is a private"),
        (None, "http://169.254.169.254/latest/meta-data", "image #0: '169.254.169.254' is a private"),
        (
            MediaPolicy(allowed_domains=("media.example.com",)),
            "{server}/cat.png",
            "image #0: fetching from '127.0.0.1' is not allowed; this server fetches media only from media.example.com",
        ),
        (MediaPolicy(allowed_domains=()), "https://example.com/cat.png", "only from no domain"),
        (None, "ftp://example.com/cat.png", "image #0: expected an http"),
        (None, "https:///cat.png", "image #0: .* is not .*URL"),
    ],
)
def test_refused_urls_are_400_naming_the_part(policy_gateway, media_server, policy, url, message):
    with policy_gateway(policy) as chat:
        with pytest.raises(openai.BadRequestError, match=message):
            _ask(chat, {"type": "text", "text": "look"}, _image(url.format(server=media_server)))
        _still_serving(chat)


def test_a_redirect_to_a_private_address_is_refused(media_server):
    # The first hop is listed (private allowed); its redirect's host is not.
    policy = MediaPolicy(allowed_domains=("127.0.0.1",))
    redirect = f"{media_server}/redirect".replace("127.0.0.1", "localhost")
    with pytest.raises(InvalidRequestError, match="fetching from 'localhost' is not allowed"):
        asyncio.run(fetch(redirect, policy, "image #0"))
    hops = MediaPolicy(allowed_domains=("127.0.0.1",), max_redirects=0)
    with pytest.raises(InvalidRequestError, match="redirects more than 0 times"):
        asyncio.run(fetch(f"{media_server}/redirect", hops, "image #0"))


def test_the_fetch_connects_to_the_checked_address_and_names_the_host(media_server):
    # Pinned to the resolved address, the request still carries the URL's host (virtual hosting, TLS SNI).
    url = media_server.replace("127.0.0.1", "localhost")
    body, mime = asyncio.run(fetch(f"{url}/host", MediaPolicy(allowed_domains=("localhost",)), "image #0"))
    assert (body.decode(), mime) == (url.removeprefix("http://"), "text/plain")


@pytest.mark.parametrize("fmt", ["mp3", "flac", "ogg"])
def test_input_audio_takes_compressed_formats(local_chat, fmt):
    clip = base64.b64encode(audio_clip(fmt, seconds=0.2)).decode()
    answer = _ask(local_chat, {"type": "input_audio", "input_audio": {"data": clip, "format": fmt}})
    assert answer.startswith("[1 media, ")


@pytest.mark.parametrize(
    "clip, fmt, message",
    [
        (b"ID3 garbage", "mp3", "audio #0 could not be decoded as MP3"),
        (wav(), "midi", "audio #0: format 'midi' is not supported"),
        (png(), "wav", "audio #0 (could not be decoded as WAV|holds no audio stream)"),
    ],
    ids=["garbage", "unknown-format", "an-image"],
)
def test_undecodable_audio_is_400(local_chat, clip, fmt, message):
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip).decode(), "format": fmt}}
    with pytest.raises(openai.BadRequestError, match=message):
        _ask(local_chat, part)
    _still_serving(local_chat)


def test_media_policy_refuses_nonsense_limits():
    with pytest.raises(ValueError, match="positive limits"):
        MediaPolicy(max_bytes=0)
    assert MediaPolicy(allowed_domains=(" Media.Example.COM. ",)).allowed_domains == ("media.example.com",)
