"""Speech and transcription through the official `openai` client, audio formats of chat completions,
and the /v1 API key: each format decoded back with PyAV, each bad input a 4xx in the error body."""

from __future__ import annotations

import base64
import io
import json

import av
import httpx
import openai
import pytest
from gateway_apps import ADMIN, APPS, SPEAKER, TOKEN, VOICE, VOICE_SAMPLES_PER_WORD, sse_events, wav
from toy.executors import EXECUTORS

from prismserve.gateway import create_gateway
from prismserve.runtime import LocalRuntime

KEY = "sk-test-key"

# What a decoded clip may hold beyond the samples sent: codec frames of priming and padding (AAC's
# ADTS and Opus's pre-skip are not trimmed by every decoder, and a streamed MP3 has no gapless
# header: LAME writes it at the end of a file it can seek); the lossless formats come back exact.
SLACK_S = {"wav": 0.0, "flac": 0.0, "mp3": 0.07, "opus": 0.07, "aac": 0.13}


@pytest.fixture
def served(serve_gateway):
    """(httpx client, openai client) of a gateway serving the toy apps and `voice`, without an API key."""
    app = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN, max_request_bytes=1 << 20)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for name, source in {**APPS, "voice": VOICE, "speaker": SPEAKER}.items():
            assert client.post("/admin/apps", json={"name": name, "source": source}, headers=ADMIN).is_success
        yield client, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def keyed(serve_gateway):
    """The base URL of a gateway with the API key KEY, serving `voice`."""
    app = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN, api_key=KEY, max_request_bytes=1 << 20)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/admin/apps", json={"name": "voice", "source": VOICE}, headers=ADMIN).is_success
        yield url


def decoded(data: bytes) -> tuple[int, int]:
    """(samples, sample rate) of an audio file, decoded by PyAV."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        return sum(frame.samples for frame in container.decode(stream)), stream.codec_context.sample_rate


def assert_duration(data: bytes, fmt: str, seconds: float) -> None:
    samples, rate = decoded(data)
    assert seconds <= samples / rate <= seconds + SLACK_S[fmt] + 1e-9, (fmt, samples, rate)


# --- speech -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_speech_comes_back_in_each_format_and_decodes_to_its_length(served, fmt):
    _, client = served
    speech = client.audio.speech.create(
        model="voice", input="one two three", voice="alloy", response_format=fmt
    )
    content_type = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac"}
    assert speech.response.headers["content-type"] == content_type.get(fmt, "audio/wav")
    assert_duration(speech.content, fmt, 3 * VOICE_SAMPLES_PER_WORD / 24000)


def test_speech_as_raw_pcm_is_24_khz_16_bit_samples(served):
    _, client = served
    speech = client.audio.speech.create(
        model="voice", input="two words", voice="verse", response_format="pcm"
    )
    assert speech.response.headers["content-type"] == "audio/pcm"
    assert len(speech.content) == 2 * 2 * VOICE_SAMPLES_PER_WORD


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"model": "answer"}, "app 'answer' cannot speak"),
        ({"model": "embed"}, "app 'embed' does not take chat requests"),
        ({"model": "nope"}, "nope"),
        ({"speed": 1.5}, "speed 1.5 is not supported"),
        ({"voice": "nobody"}, "unknown voice 'nobody'"),
        ({"response_format": "ogg"}, "response_format"),
        ({"input": ""}, "input"),
    ],
)
def test_speech_refuses_what_it_cannot_honour_with_a_4xx_naming_it(served, fields, message):
    gateway, _ = served
    body = {"model": "voice", "input": "hi", "voice": "alloy", **fields}
    refused = gateway.post("/v1/audio/speech", json=body)
    assert 400 <= refused.status_code < 500 and message in refused.json()["error"]["message"], refused.text
    assert refused.json()["error"]["code"] == ("model_not_found" if fields.get("model") == "nope" else None)
    assert gateway.get("/health").status_code == 200


# --- streamed speech ----------------------------------------------------------------------------------

HEADER = {"pcm": 0, "wav": 44}  # bytes before the samples
AUDIO_TYPES = {
    "pcm": "audio/pcm",
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
}


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus", "aac", "flac"])
def test_speech_streams_as_the_app_speaks_and_the_whole_stream_decodes(served, tmp_path, fmt):
    """The first word's audio reaches the client while the app still waits to say the rest: the
    response goes out as it is encoded, not once the answer is whole."""
    gateway, _ = served
    gate = tmp_path / "gate"
    body = {"model": "speaker", "input": f"one {gate} two three", "voice": "alloy", "response_format": fmt}
    with gateway.stream("POST", "/v1/audio/speech", json=body, timeout=10) as response:
        assert response.status_code == 200
        chunks, first = response.iter_raw(), b""
        # Raw PCM and WAV give each sample as it comes; a compressed format, its first bytes.
        while len(first) < (HEADER[fmt] + 2 * VOICE_SAMPLES_PER_WORD if fmt in HEADER else 1):
            first += next(chunks)  # a read timeout here: the server held the speech back
        gate.touch()
        data = first + b"".join(chunks)
    assert response.headers["content-type"] == AUDIO_TYPES[fmt]
    if fmt == "pcm":
        assert len(first) == 2 * VOICE_SAMPLES_PER_WORD and len(data) == 3 * 2 * VOICE_SAMPLES_PER_WORD
        return
    if fmt == "wav":
        assert data[:4] == b"RIFF" and data[40:44] == b"\xff\xff\xff\xff"  # its length unknown at the start
        assert len(data) == 44 + 3 * 2 * VOICE_SAMPLES_PER_WORD
    assert_duration(data, fmt, 3 * VOICE_SAMPLES_PER_WORD / 24000)


def test_speech_as_server_sent_events_through_the_openai_client(served):
    """OpenAI's `speech.audio.delta` events carry the file in `response_format`, base64; the last
    event, `speech.audio.done`, the usage."""
    _, client = served
    with client.audio.speech.with_streaming_response.create(
        model="speaker", input="one two three", voice="alloy", response_format="wav", stream_format="sse"
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(data) for _, data in sse_events(response.iter_lines())]
    deltas, done = events[:-1], events[-1]
    assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert len(audio) == 44 + 3 * 2 * VOICE_SAMPLES_PER_WORD
    assert done == {
        "type": "speech.audio.done",
        "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8},
    }


def test_a_failure_after_the_first_audio_ends_the_speech_stream_saying_so_and_the_server_goes_on(served):
    gateway, _ = served
    body = {"model": "speaker", "input": "one fail", "voice": "alloy", "response_format": "pcm"}
    with gateway.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "sse"}) as response:
        events = sse_events(response.iter_lines())
    assert [event for event, _ in events] == [None, "error"]
    error = json.loads(events[1][1])["error"]
    assert error["type"] == "app_error" and "vocoder" not in error["message"]  # no internals
    # An audio stream has no status left to send: it is cut short, not ended as if whole.
    with (
        pytest.raises(httpx.RemoteProtocolError),
        gateway.stream("POST", "/v1/audio/speech", json=body) as response,
    ):
        response.read()
    # Before any audio, the failure gets its status code; the server still serves.
    failed = gateway.post("/v1/audio/speech", json={**body, "input": "fail"})
    assert failed.status_code == 500 and "error" in failed.json()
    again = gateway.post("/v1/audio/speech", json={**body, "input": "again"})
    assert again.status_code == 200 and len(again.content) == 2 * VOICE_SAMPLES_PER_WORD


# --- voices ---------------------------------------------------------------------------------------------


def test_the_voices_of_a_speaking_app_and_the_refusals_of_the_route(served):
    gateway, _ = served
    assert gateway.get("/v1/audio/voices", params={"model": "voice"}).json() == {
        "model": "voice",
        "voices": ["alloy", "verse"],
    }
    # An app that speaks but does not list its voices says so with an empty list.
    assert gateway.get("/v1/audio/voices", params={"model": "speaker"}).json()["voices"] == []
    for params, status, message in [
        ({}, 400, "the apps that speak are omni, speaker, voice"),
        ({"model": "answer"}, 400, "app 'answer' cannot speak"),
        ({"model": "embed"}, 400, "does not take chat requests"),
        ({"model": "nope"}, 404, "nope"),
    ]:
        refused = gateway.get("/v1/audio/voices", params=params)
        assert refused.status_code == status and message in refused.json()["error"]["message"], refused.text


# --- transcription ------------------------------------------------------------------------------------


def test_transcription_through_the_openai_client(served):
    _, client = served
    transcript = client.audio.transcriptions.create(model="voice", file=("clip.wav", wav(1600), "audio/wav"))
    assert transcript.text == "heard 1600 samples at 16000 Hz"
    text = client.audio.transcriptions.create(
        model="voice", file=("clip.wav", wav(800), "audio/wav"), response_format="text", language="fr"
    )
    assert text.strip() == "fr: heard 800 samples at 16000 Hz"


def test_transcription_takes_compressed_files(served):
    _, client = served
    speech = client.audio.speech.create(model="voice", input="a b", voice="alloy", response_format="flac")
    transcript = client.audio.transcriptions.create(model="voice", file=("clip.flac", speech.content))
    assert transcript.text == f"heard {2 * VOICE_SAMPLES_PER_WORD} samples at 24000 Hz"


@pytest.mark.parametrize(
    "fields, file, message",
    [
        ({"model": "answer"}, wav(), "app 'answer' does not take audio"),
        ({"model": "voice"}, b"not audio at all", "file could not be decoded as audio"),
        ({"model": "voice", "response_format": "srt"}, wav(), "response_format 'srt' is not supported"),
        ({"model": "voice", "response_format": "verbose_json"}, wav(), "needs timestamps"),
        ({"model": "voice", "stream": "true"}, wav(), "stream is not supported"),
        ({"model": "voice", "timestamp_granularities[]": "word"}, wav(), "timestamp_granularities[]"),
        ({"model": "voice", "temperature": "hot"}, wav(), "temperature"),
        ({}, wav(), "model"),
        ({"model": "voice"}, None, "file"),
    ],
)
def test_transcription_refuses_bad_forms_with_a_4xx_naming_the_field(served, fields, file, message):
    gateway, _ = served
    files = {"file": ("clip.wav", file, "audio/wav")} if file is not None else {"x": ("x", b"", "text/plain")}
    refused = gateway.post("/v1/audio/transcriptions", data=fields, files=files)
    assert 400 <= refused.status_code < 500 and message in refused.json()["error"]["message"], refused.text
    assert gateway.get("/health").status_code == 200


def test_transcription_wants_a_multipart_form(served):
    gateway, _ = served
    refused = gateway.post("/v1/audio/transcriptions", json={"model": "voice"})
    assert refused.status_code == 415 and "multipart/form-data" in refused.json()["error"]["message"]
    broken = gateway.post(
        "/v1/audio/transcriptions", content=b"--x\r\n", headers={"content-type": "multipart/form-data"}
    )
    assert broken.status_code == 400, broken.text


def test_the_audio_routes_are_in_the_openapi_document(served):
    gateway, _ = served
    paths = gateway.get("/openapi.json").json()["paths"]
    speech = paths["/v1/audio/speech"]["post"]
    assert speech["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OpenAISpeechRequest"
    }
    assert {"audio/mpeg", "audio/wav", "audio/pcm"} <= set(speech["responses"]["200"]["content"])
    form = paths["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert form["schema"] == {"$ref": "#/components/schemas/OpenAITranscriptionForm"}


# --- chat completions' audio formats ------------------------------------------------------------------


def _chat(client: openai.OpenAI, fmt: str, **extra):
    return client.chat.completions.create(
        model="voice",
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": fmt},
        messages=[{"role": "user", "content": "four words right here"}],
        **extra,
    )


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "opus", "aac"])
def test_chat_audio_comes_back_in_each_format(served, fmt):
    _, client = served
    audio = _chat(client, fmt).choices[0].message.audio
    assert audio.transcript == "four words right here"
    assert_duration(base64.b64decode(audio.data), fmt, 4 * VOICE_SAMPLES_PER_WORD / 24000)


def test_chat_audio_as_pcm16_is_the_samples(served):
    _, client = served
    audio = _chat(client, "pcm16").choices[0].message.audio
    assert len(base64.b64decode(audio.data)) == 2 * 4 * VOICE_SAMPLES_PER_WORD


def test_streamed_chat_audio_is_pcm16_with_the_text_as_its_transcript(served):
    _, client = served
    transcript, audio, expires = "", b"", None
    for chunk in _chat(client, "pcm16", stream=True):
        delta = chunk.choices[0].delta
        assert not delta.content  # the text is the audio's transcript, as OpenAI streams it
        part = (delta.model_extra or {}).get("audio") or {}
        transcript += part.get("transcript", "")
        audio += base64.b64decode(part.get("data", ""))
        expires = part.get("expires_at", expires)
    assert transcript == "four words right here" and expires is not None
    assert len(audio) == 2 * 4 * VOICE_SAMPLES_PER_WORD


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus"])
def test_a_streamed_chat_refuses_formats_openai_does_not_stream(served, fmt):
    _, client = served
    with pytest.raises(openai.BadRequestError, match=f"audio.format '{fmt}' is not streamed"):
        _chat(client, fmt, stream=True)


def test_a_streamed_chat_without_a_format_streams_pcm16(served):
    gateway, _ = served
    body = {
        "model": "voice",
        "modalities": ["text", "audio"],
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    with gateway.stream("POST", "/v1/chat/completions", json=body) as response:
        events = sse_events(response.iter_lines())
    chunks = [json.loads(data) for _, data in events if data != "[DONE]"]
    audio = [c["choices"][0]["delta"].get("audio", {}) for c in chunks]
    assert "".join(a.get("transcript", "") for a in audio) == "hi"
    assert sum(len(base64.b64decode(a.get("data", ""))) for a in audio) == 2 * VOICE_SAMPLES_PER_WORD


# --- the API key ----------------------------------------------------------------------------------------


def test_the_right_api_key_opens_the_v1_routes(keyed):
    client = openai.OpenAI(base_url=f"{keyed}/v1", api_key=KEY, max_retries=0)
    answer = client.chat.completions.create(model="voice", messages=[{"role": "user", "content": "hello"}])
    assert answer.choices[0].message.content == "hello"
    speech = client.audio.speech.create(model="voice", input="hi", voice="alloy", response_format="wav")
    assert_duration(speech.content, "wav", VOICE_SAMPLES_PER_WORD / 24000)


@pytest.mark.parametrize("key", ["sk-wrong", TOKEN])
def test_a_wrong_key_or_the_admin_token_is_refused_as_openai_refuses(keyed, key):
    client = openai.OpenAI(base_url=f"{keyed}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model="voice", messages=[{"role": "user", "content": "hi"}])
    error = refused.value.body
    assert error["type"] == "invalid_request_error" and "incorrect API key" in error["message"]
    assert refused.value.response.headers["www-authenticate"] == "Bearer"


def test_a_missing_key_is_a_401_on_every_v1_route_and_health_stays_open(keyed):
    with httpx.Client(base_url=keyed, timeout=30) as client:
        for path in (
            "/v1/chat/completions",
            "/v1/audio/speech",
            "/v1/audio/transcriptions",
            "/v1/apps/voice/invoke",
        ):
            refused = client.post(path, json={})
            assert refused.status_code == 401, path
            assert (
                refused.json()["error"]["code"] == "invalid_api_key"
                and "no API key" in refused.json()["error"]["message"]
            )
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        document = client.get("/openapi.json").json()
        chat = document["paths"]["/v1/chat/completions"]["post"]
        assert chat["security"] == [{"ApiKey": []}] and "401" in chat["responses"]
        # The API key opens no admin route, and the admin token still does.
        bearer = {"Authorization": f"Bearer {KEY}"}
        assert client.get("/admin/apps", headers=bearer).status_code == 401
        assert client.get("/admin/apps", headers=ADMIN).status_code == 200


def test_an_empty_api_key_is_refused_at_start():
    with pytest.raises(ValueError, match="API key must not be empty"):
        create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN, api_key="")


# --- the encoder ----------------------------------------------------------------------------------------


def test_encode_audio_takes_a_rate_the_encoder_does_not_and_resampling_keeps_the_duration():
    from prismserve.gateway.media import AudioStreamEncoder, encode_audio

    pcm = b"\x10\x00" * 22050  # one second at 22.05 kHz, which Opus does not take
    samples, rate = decoded(encode_audio(pcm, 22050, "opus"))
    assert rate in (24000, 48000) and 1.0 <= samples / rate <= 1.0 + SLACK_S["opus"]
    resampler = AudioStreamEncoder("pcm", 24000)  # in ten pieces, as a stream arrives
    resampled = b"".join(resampler.feed(pcm[i : i + 4410], 22050) for i in range(0, len(pcm), 4410))
    assert abs(len(resampled + resampler.finish()) // 2 - 24000) <= 32
    assert encode_audio(pcm + b"\x01", 22050, "pcm16") == pcm  # a trailing odd byte is no sample
