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
            say = {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"one {gate} two"}],
            }
            send(socket, "conversation.item.create", item=say)
            send(socket, "response.create")
            until(socket, "response.output_audio.delta")  # the first word said, the app waits at the gate
            send(socket, "response.create")  # one response at a time
            refused = until(socket, "error")[-1]
            send(socket, "response.cancel")
            cancelled = until(socket, "response.done")[-1]
            gate.touch()
            send(
                socket,
                "conversation.item.create",
                item={**say, "content": [{"type": "input_text", "text": "four"}]},
            )
            send(socket, "response.create")
            again = until(socket, "response.done")[-1]
    assert "a response is in progress" in refused["error"]["message"]
    assert cancelled["response"]["status"] == "cancelled"
    assert again["response"]["status"] == "completed" and again["response"]["usage"]["output_tokens"] == 1


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ("not json", "the event is not JSON"),
        (json.dumps({"type": "session.fly"}), "unknown event type 'session.fly'"),
        (
            json.dumps({"type": "session.update", "session": {"temperature_of_mars": 1}}),
            "temperature_of_mars",
        ),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}), "not valid base64"),
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
            say = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"one {tmp_path / 'never'} two"}]}  # fmt: skip
            send(socket, "conversation.item.create", item=say)
            send(socket, "response.create")
            until(socket, "response.output_audio.delta")
        counted = 'prismserve_requests_total{app="speaker",request_type="text->audio",status="cancelled"} 1.0'
        deadline = time.monotonic() + 10
        while counted not in httpx.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline, "the response's request was not cancelled"
            time.sleep(0.05)
