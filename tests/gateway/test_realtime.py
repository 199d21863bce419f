"""The Realtime API's WebSocket session: the official `openai` client's realtime connection against
the toy speaking apps, the input audio buffer, cancelling, and bad events that keep the session."""

from __future__ import annotations

import base64
import json

import httpx
import openai
import pytest
from gateway_apps import ADMIN, SPEAKER, TOKEN, VOICE, VOICE_SAMPLES_PER_WORD
from toy.executors import EXECUTORS
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from prismserve.gateway import create_gateway
from prismserve.runtime import LocalRuntime

KEY = "sk-realtime"


@pytest.fixture
def served(serve_gateway):
    """The base URL of a gateway serving `speaker` and `voice`; `keyed`: with the API key KEY."""

    def start(api_key: str | None = None):
        app = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN, api_key=api_key)
        return serve_gateway(app)

    return start


def register(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        for name, source in {"speaker": SPEAKER, "voice": VOICE}.items():
            assert http.post("/admin/apps", json={"name": name, "source": source}, headers=ADMIN).is_success


def until(socket, kind: str) -> list[dict]:
    """The events received up to and with the first of type `kind`."""
    events = []
    while True:
        events.append(json.loads(socket.recv(timeout=10)))
        if events[-1]["type"] == kind:
            return events


def send(socket, kind: str, **fields) -> None:
    socket.send(json.dumps({"type": kind, **fields}))


def hold_a_response(socket, gate) -> None:
    """A response in progress: the app has said its first word and waits for the file `gate`."""
    say = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"one {gate} two"}]}
    send(socket, "conversation.item.create", item=say)
    send(socket, "response.create")
    until(socket, "response.output_audio.delta")


def test_the_openai_clients_realtime_connection_hears_the_app_speak(served):
    with served() as url:
        register(url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        with client.realtime.connect(model="speaker") as connection:
            assert connection.recv().type == "session.created"
            connection.session.update(session={"type": "realtime", "instructions": "Be brief."})
            assert connection.recv().type == "session.updated"
            connection.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "one two three"}],
                }
            )
            connection.response.create()
            events = []
            while not events or events[-1].type != "response.done":
                events.append(connection.recv())
    kinds = [e.type for e in events]
    assert kinds[:2] == ["conversation.item.added", "conversation.item.done"]
    assert (
        kinds.index("response.created")
        < kinds.index("response.output_audio.delta")
        < kinds.index("response.done")
    )
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert transcript == "one two three " and len(audio) == 3 * 2 * VOICE_SAMPLES_PER_WORD
    done = events[-1].response
    assert done.status == "completed" and done.usage.output_tokens == 3 and done.usage.input_tokens == 5


def test_committed_audio_is_the_users_turn_and_text_out_is_text_deltas(served):
    with served() as url:
        register(url)
        ws_url = url.replace("http", "ws") + "/v1/realtime?model=voice"
        with connect(ws_url) as socket:
            until(socket, "session.created")
            send(socket, "session.update", session={"output_modalities": ["text"]})
            until(socket, "session.updated")
            for _ in range(2):
                send(socket, "input_audio_buffer.append", audio=base64.b64encode(b"\x01\x00" * 2400).decode())
            send(socket, "input_audio_buffer.commit")
            committed = until(socket, "input_audio_buffer.committed")[-1]
            send(socket, "response.create")
            events = until(socket, "response.done")
            # A second turn keeps the first: the app hears the whole conversation.
            send(socket, "conversation.item.create", item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]})  # fmt: skip
            send(socket, "response.create")
            second = until(socket, "response.done")
    assert committed["item_id"].startswith("item_")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "heard 4800 samples at 24000 Hz"
    assert not [e for e in events if e["type"] == "response.output_audio.delta"]
    assert [e["text"] for e in second if e["type"] == "response.output_text.done"] == [
        "heard 4800 samples at 24000 Hz"
    ]


def test_a_cancelled_response_ends_cancelled_and_the_session_goes_on(served, tmp_path):
    gate = tmp_path / "gate"
    with served() as url:
        register(url)
        with connect(url.replace("http", "ws") + "/v1/realtime?model=speaker") as socket:
            until(socket, "session.created")
            hold_a_response(socket, gate)
            send(socket, "response.create")  # one response at a time
            refused = until(socket, "error")[-1]
            send(socket, "response.cancel")
            cancelled = until(socket, "response.done")[-1]
            gate.touch()
            four = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "four"}]}
            send(socket, "conversation.item.create", item=four)
            send(socket, "response.create")
            again = until(socket, "response.done")[-1]
    assert "a response is in progress" in refused["error"]["message"]
    assert cancelled["response"]["status"] == "cancelled"
    assert again["response"]["status"] == "completed" and again["response"]["usage"]["output_tokens"] == 1


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ("not json", "the event is not JSON"),
        (b"\x00binary", "not binary ones"),
        (json.dumps({"type": "session.fly"}), "unknown event type 'session.fly'"),
        (
            json.dumps({"type": "session.update", "session": {"temperature_of_mars": 1}}),
            "temperature_of_mars",
        ),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}), "not valid base64"),
        (json.dumps({"type": "session.update", "session": {"model": "voice"}}), "is not this session's app"),
        (json.dumps({"type": "input_audio_buffer.commit"}), "the buffer is empty"),
        (json.dumps({"type": "response.cancel"}), "no response is in progress"),
        (
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_file"}]},
                }
            ),
            "input_file",
        ),  # fmt: skip
    ],
)
def test_a_bad_event_gets_an_error_naming_it_and_the_session_goes_on(served, event, message):
    with served() as url:
        register(url)
        with connect(url.replace("http", "ws") + "/v1/realtime?model=speaker") as socket:
            until(socket, "session.created")
            socket.send(event)
            error = until(socket, "error")[-1]["error"]
            send(socket, "conversation.item.create", item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "still"}]})  # fmt: skip
            send(socket, "response.create")
            done = until(socket, "response.done")[-1]
    assert message in error["message"] and error["type"] == "invalid_request_error"
    assert done["response"]["status"] == "completed"


def test_the_api_key_applies_and_an_unknown_app_is_said_before_closing(served):
    with served(api_key=KEY) as url:
        register(url)
        ws_url = url.replace("http", "ws") + "/v1/realtime?model="
        with pytest.raises(InvalidStatus):
            connect(ws_url + "speaker")
        headers = {"Authorization": f"Bearer {KEY}"}
        with connect(ws_url + "speaker", additional_headers=headers) as socket:
            assert until(socket, "session.created")[-1]["session"]["model"] == "speaker"
        with connect(ws_url + "nope", additional_headers=headers) as socket:
            error = until(socket, "error")[-1]["error"]
    assert "nope" in error["message"]


def test_a_client_that_leaves_mid_response_cancels_its_work(served, tmp_path):
    """The app's serve() for the response is cancelled (counted so), not left waiting at its gate."""
    import time

    with served() as url:
        register(url)
        with connect(url.replace("http", "ws") + "/v1/realtime?model=speaker") as socket:
            until(socket, "session.created")
            hold_a_response(socket, tmp_path / "never")
        counted = 'prismserve_requests_total{app="speaker",request_type="text->audio",status="cancelled"} 1.0'
        deadline = time.monotonic() + 10
        while counted not in httpx.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline, "the response's request was not cancelled"
            time.sleep(0.05)


def speech_24k() -> bytes:
    """A spoken query (the workloads' clip) as the session's input: 16-bit mono PCM at 24 kHz."""
    from prismserve.bench.workloads import workloads_dir
    from prismserve.gateway.media import AudioStreamEncoder, decode_audio

    pcm, rate = decode_audio((workloads_dir() / "media" / "query_to_cars.wav").read_bytes(), "clip")
    encoder = AudioStreamEncoder("pcm", 24000)
    return encoder.feed(pcm, rate) + encoder.finish()


def speak(socket, pcm: bytes, silence_s: float = 0.0) -> None:
    """Append `pcm` and then `silence_s` of silence, in 100 ms pieces as a microphone sends them."""
    audio = pcm + b"\x00\x00" * int(24000 * silence_s)
    for i in range(0, len(audio), 4800):
        send(socket, "input_audio_buffer.append", audio=base64.b64encode(audio[i : i + 4800]).decode())


def test_server_turn_detection_commits_a_spoken_turn_and_answers_it(served):
    """silero-vad hears the clip start and, after the silence that follows, end: the turn (the
    speech and the padding before it) is committed and answered without a commit or response.create."""
    clip = speech_24k()
    with served() as url:
        register(url)
        with connect(url.replace("http", "ws") + "/v1/realtime?model=voice") as socket:
            created = until(socket, "session.created")[-1]["session"]
            # The clip has a breath, then 1.25 s of pause, before the query: one turn with a longer silence.
            detect = {"type": "server_vad", "silence_duration_ms": 1500}
            update = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": detect}}}
            send(socket, "session.update", session=update)
            until(socket, "session.updated")
            speak(socket, b"\x00\x00" * 24000, 0)  # a second of silence first: not a turn, not kept
            speak(socket, clip, silence_s=2.0)
            events = until(socket, "response.done")
    assert created["audio"]["input"]["turn_detection"]["type"] == "server_vad"  # as OpenAI's sessions start
    kinds = [e["type"] for e in events]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index("input_audio_buffer.speech_stopped")
    assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed")
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    assert started["item_id"] == committed["item_id"] and 900 <= started["audio_start_ms"] <= 1500
    heard = next(e["text"] for e in events if e["type"] == "response.output_text.done")
    samples = int(heard.split()[1])  # "heard N samples at 24000 Hz": the committed turn
    # At least the speech (1.3 s to 5.6 s into the clip, as silero-vad hears it); at most what came
    # after the leading second of silence, which was not kept.
    assert (5.6 - 1.3) * 24000 < samples <= len(clip) // 2 + 2 * 24000


def test_speech_while_the_app_answers_interrupts_the_answer(served, tmp_path):
    """Barge-in: the user speaking cancels the response in progress at once."""
    clip = speech_24k()
    with served() as url:
        register(url)
        with connect(url.replace("http", "ws") + "/v1/realtime?model=speaker") as socket:
            until(socket, "session.created")
            hold_a_response(socket, tmp_path / "never")
            speak(socket, clip)
            events = until(socket, "response.done")
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.speech_started" in kinds
    assert events[-1]["response"]["status"] == "cancelled"
    assert "response.output_audio.delta" not in kinds[kinds.index("input_audio_buffer.speech_started") :]
