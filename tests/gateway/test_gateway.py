"""The gateway over an in-process runtime: admin API, invoke API, OpenAI API, errors, metrics."""

from __future__ import annotations

import base64
import io
import json
import wave

import openai
import pytest
from gateway_apps import ADMIN, OMNI, b64, chat_body, data_url, png, wav
from media_clips import video_clip, video_with_sound

# --- admin API -----------------------------------------------------------------------------------


def test_admin_api_needs_the_bearer_token(gateway):
    assert gateway.get("/admin/apps").status_code == 401
    assert gateway.get("/admin/apps", headers={"Authorization": "Bearer wrong"}).status_code == 401
    refused = gateway.post("/admin/apps", json={"name": "x", "source": OMNI})
    assert refused.status_code == 401 and "bearer token" in refused.json()["error"]["message"]
    listed = gateway.get("/admin/apps", headers=ADMIN).json()["apps"]
    assert [a["name"] for a in listed] == ["omni", "answer", "embed"]
    omni = listed[0]
    assert omni["streaming"] and omni["input_modalities"] == ["audio", "image", "text"]
    assert set(omni["deployments"]) == {
        "omni.talker",
        "omni.vocoder",
        "omni.thinker.encoders.image",
        "omni.thinker.encoders.audio",
        "omni.thinker.llm",
    }


def test_register_errors_are_clear_and_unregister_removes(gateway):
    bad = gateway.post("/admin/apps", json={"name": "bad", "source": "def serve(:\n"}, headers=ADMIN)
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "bad.py:1: syntax error: invalid syntax"
    duplicate = gateway.post("/admin/apps", json={"name": "omni", "source": OMNI}, headers=ADMIN)
    assert duplicate.status_code == 409 and "already registered" in duplicate.json()["error"]["message"]
    assert gateway.post("/admin/apps", json={"name": "x"}, headers=ADMIN).status_code == 400
    assert gateway.delete("/admin/apps/answer", headers=ADMIN).json() == {"unregistered": "answer"}
    assert gateway.delete("/admin/apps/answer", headers=ADMIN).status_code == 404
    assert gateway.get("/health").json() == {"status": "ok", "apps": ["embed", "omni"]}


def test_plans_are_validated_against_the_app(gateway):
    plan = {"cells": [{"gpus": 1, "replicas": {"omni.nothing": 1}}]}
    refused = gateway.post("/admin/apps/omni/plan", json=plan, headers=ADMIN)
    assert refused.status_code == 400 and "does not have" in refused.json()["error"]["message"]
    good = {"cells": [{"gpus": 2, "count": 2, "replicas": {"omni.thinker.llm": 1, "omni.talker": 1}}]}
    accepted = gateway.post("/admin/apps/omni/plan", json=good, headers=ADMIN).json()
    assert accepted == {"app": "omni", "gpus": 4, "replicas": {"omni.thinker.llm": 2, "omni.talker": 2}}
    bad_routing = {"cells": [], "routing": {"text": {"a": 0.5}}}
    assert gateway.post("/admin/apps/omni/plan", json=bad_routing, headers=ADMIN).status_code == 400
    missing = gateway.post("/admin/apps/nope/plan", json=good, headers=ADMIN)
    assert missing.status_code == 404 and "no app named 'nope'" in missing.json()["error"]["message"]


def test_status_lists_apps_and_the_deployments_they_share(gateway):
    assert gateway.get("/admin/status").status_code == 401
    status = gateway.get("/admin/status", headers=ADMIN).json()
    assert set(status["apps"]) == {"omni", "answer", "embed"}
    llm = status["apps"]["omni"]["deployments"]["omni.thinker.llm"]
    assert status["deployments"][llm]["executor_kind"] == "llm"


# --- invoke API ----------------------------------------------------------------------------------


def test_invoke_returns_json_for_a_non_streaming_app(gateway):
    response = gateway.post("/v1/apps/answer/invoke", json=chat_body("two words"))
    assert response.status_code == 200
    assert response.json()["text"] == "[0 media, 0.000] user: two words"
    embed = gateway.post("/v1/apps/embed/invoke", json={"data": "img"}).json()
    assert len(embed["values"]) == 4


def test_invoke_streams_server_sent_events_for_a_streaming_app(gateway):
    with gateway.stream("POST", "/v1/apps/omni/invoke", json=chat_body("hi there")) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    texts = [json.loads(line[6:])["text"] for line in lines[:-1]]
    assert "".join(texts) == "[0 media, 0.000] user: hi there"


def test_invoke_takes_media_as_base64_and_streams_audio_as_base64(gateway):
    body = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi"}, {"type": "image", "data": b64(png())}],
            }
        ],
        "modalities": ["text", "audio"],
    }
    with gateway.stream("POST", "/v1/apps/omni/invoke", json=body) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["text"].startswith("[1 media, ")  # the encoder got the decoded PNG
    audio = [base64.b64decode(c["audio"]) for c in chunks if c["audio"] is not None]
    # The toy vocoder: one 4-byte chunk per token, each byte the token's length (16, 5, 2).
    assert audio == [bytes([16]) * 4, bytes([5]) * 4, bytes([2]) * 4]


@pytest.mark.parametrize(
    "app, part, status, message",
    [
        ("omni", {"type": "image", "data": b64(b"not a png")}, 400, "image #0 could not be decoded"),
        (
            "omni",
            {"type": "image", "data": "%%%"},
            400,
            "image #0 (messages.0.content.0.data) is not valid base64",
        ),
        ("omni", {"type": "audio", "data": b64(b"RIFF....")}, 400, "audio #0 could not be decoded as WAV"),
        ("answer", {"type": "audio", "data": b64(wav())}, 400, "app 'answer' does not accept audio input"),
        ("omni", {"type": "file", "data": "AAAA"}, 400, "does not match any of the expected tags"),
        ("omni", {"type": "video", "data": "AAAA"}, 400, "app 'omni' does not accept video input"),
    ],
)
def test_invoke_checks_chat_media_like_the_openai_api(gateway, app, part, status, message):
    response = gateway.post(
        f"/v1/apps/{app}/invoke", json={"messages": [{"role": "user", "content": [part]}]}
    )
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/v1/apps/nope/invoke", b"{}", 404, "no app named 'nope'; registered: ['answer', 'embed', 'omni']"),
        ("/v1/apps/answer/invoke", b"{not json", 400, "malformed JSON"),
        ("/v1/apps/answer/invoke", b'{"messages": []}', 400, "messages: List should have at least 1 item"),
        ("/v1/apps/answer/invoke", b"x" * (1 << 20 + 1), 413, "larger than the limit of 1048576 bytes"),
        ("/v1/chat/completions", b'{"model": "answer"}', 400, "messages: Field required"),
    ],
)
def test_bad_requests_get_a_4xx_that_says_what_is_wrong(gateway, path, body, status, message):
    response = gateway.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    assert message in response.json()["error"]["message"]
    assert gateway.post("/v1/apps/answer/invoke", json=chat_body("still serving")).status_code == 200


def test_an_executor_failure_is_a_5xx_naming_the_component_and_the_server_keeps_serving(gateway):
    failed = gateway.post("/v1/apps/answer/invoke", json=chat_body("please crash"))
    assert failed.status_code == 502
    message = failed.json()["error"]["message"]
    assert message.startswith("app 'answer': call #0 (LLMTask) failed;") and "CUDA error" not in message
    with gateway.stream("POST", "/v1/apps/omni/invoke", json=chat_body("crash now")) as response:
        assert response.status_code == 502
    assert gateway.post("/v1/apps/answer/invoke", json=chat_body("fine")).json()["text"].endswith("fine")


# --- OpenAI API ------------------------------------------------------------------------------------


def test_openai_client_chat_with_an_image(chat):
    completion = chat.chat.completions.create(
        model="omni",
        messages=[
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": data_url(png())}},
                ],
            },
        ],
    )
    text = completion.choices[0].message.content
    assert text.startswith("[1 media, ") and text.endswith("system: be brief user: what is this")
    assert completion.choices[0].finish_reason == "stop"
    # One chunk for "[1 media, …]", then one per prompt word ("system:", "be", …, "this").
    assert completion.usage.completion_tokens == 8


def test_openai_client_streams_text(chat):
    stream = chat.chat.completions.create(
        model="answer", messages=[{"role": "user", "content": "a b c"}], stream=True
    )
    deltas = [c.choices[0].delta.content for c in stream if c.choices[0].delta.content]
    assert "".join(deltas) == "[0 media, 0.000] user: a b c"


def test_openai_client_stream_reports_usage_when_asked(chat):
    stream = chat.chat.completions.create(
        model="omni",
        messages=[{"role": "user", "content": "count these words"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert (
        chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    )  # "[0 media, …]", "user:", 3 words


def test_openai_client_gets_text_and_audio(chat):
    completion = chat.chat.completions.create(
        model="omni",
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_audio",
                        "input_audio": {"data": base64.b64encode(wav()).decode(), "format": "wav"},
                    }
                ],
            }
        ],
    )
    message = completion.choices[0].message
    assert message.content.startswith("[1 media, ") and message.content.endswith("] user:")
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as clip:
        assert (clip.getframerate(), clip.getnchannels(), clip.getsampwidth()) == (24000, 1, 2)
        # The toy vocoder makes 2 samples per token: 2 tokens, "[1 media, …]" and "user:".
        assert clip.getnframes() == 4
    assert message.audio.transcript == message.content


def test_openai_client_can_ask_for_raw_pcm16(chat):
    completion = chat.chat.completions.create(
        model="omni",
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        messages=[{"role": "user", "content": "two words"}],
    )
    # One 4-byte chunk per token, each byte the token's length: "[0 media, 0.000]", "user:", "two", "words".
    assert base64.b64decode(completion.choices[0].message.audio.data) == b"".join(
        bytes([n]) * 4 for n in (16, 5, 3, 5)
    )


def test_openai_client_streams_audio_deltas(chat):
    stream = chat.chat.completions.create(
        model="omni",
        modalities=["text", "audio"],
        messages=[{"role": "user", "content": "say it"}],
        stream=True,
    )
    audio = b""
    for chunk in stream:
        delta = chunk.choices[0].delta
        extra = getattr(delta, "audio", None) or (delta.model_extra or {}).get("audio")
        if extra:  # data, or the text as the audio's transcript, or the closing expires_at
            audio += base64.b64decode(extra.get("data", ""))
    assert len(audio) == 4 * 4  # 4 tokens, one 4-byte pcm16 chunk each


@pytest.mark.parametrize(
    "model, content, modalities, message",
    [
        (
            "omni",
            [{"type": "image_url", "image_url": {"url": "ftp://example.com/cat.png"}}],
            None,
            "image #0: expected an http.s. URL or a data URL",
        ),
        (
            "omni",
            [{"type": "image_url", "image_url": {"url": data_url(b"not a png")}}],
            None,
            "image #0 could not be decoded",
        ),
        (
            "omni",
            [
                {
                    "type": "input_audio",
                    "input_audio": {"data": base64.b64encode(b"RIFFnope").decode(), "format": "wav"},
                }
            ],
            None,
            "audio #0 could not be decoded as WAV",
        ),
        (
            "omni",
            [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}],
            None,
            "audio #0 could not be decoded as MP3",
        ),
        (
            "answer",
            [
                {
                    "type": "input_audio",
                    "input_audio": {"data": base64.b64encode(wav()).decode(), "format": "wav"},
                }
            ],
            None,
            "app 'answer' does not accept audio input",
        ),
        ("answer", "hi", ["text", "audio"], "app 'answer' does not produce audio output"),
        ("embed", "hi", None, "app 'embed' does not take chat requests"),
        (
            "omni",
            [{"type": "file", "file": {}}],
            None,
            "messages.0.content.0: Input tag 'file' found using 'type' does not match any of the expected tags",
        ),
        (
            "omni",
            [{"type": "video_url", "video_url": {"url": data_url(b"x")}}],
            None,
            "video #0: expected an http.s. URL or a data URL like data:video/mp4",
        ),
        (
            "omni",
            [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,"}}],
            None,
            "video #0 is empty",
        ),
        (
            "omni",
            [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}],
            None,
            "app 'omni' does not accept video input",
        ),
        (
            "omni",
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}],
            None,
            "image #0 is not valid base64",
        ),
    ],
)
def test_openai_requests_the_app_cannot_take_are_400(chat, model, content, modalities, message):
    with pytest.raises(openai.BadRequestError, match=message):
        chat.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": content}],
            **({"modalities": modalities} if modalities else {}),
        )


CLIPS = """
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatCompletion, ChatRequest
from toy.tasks import MLLMTask

class Config(AppConfig):
    tasks = {{"mllm": MLLMTask(model_id="m")}}  # declared (an app needs one), never called
    input_modalities = frozenset({modalities})

async def serve(request: ChatRequest) -> ChatCompletion:
    return ChatCompletion(text=f"{{len(request.videos)}} video(s) as {{request.request_type}}")
"""
"""An app that takes video (and, with audio among `modalities`, their soundtracks) and says what it got."""


def test_a_videos_soundtrack_is_asked_for_with_mm_processor_kwargs(gateway, chat):
    """vLLM's `mm_processor_kwargs.use_audio_in_video` reaches the app; an app that takes no audio,
    a video without a soundtrack and a key prismserve does not know are each a 400."""
    for name, modalities in (("clips", {"text", "video"}), ("sounding", {"text", "video", "audio"})):
        source = CLIPS.format(modalities=sorted(modalities))
        assert (
            gateway.post("/admin/apps", json={"name": name, "source": source}, headers=ADMIN).status_code
            == 201
        )

    def ask(model: str, clip: bytes, **kwargs) -> str:
        content = [{"type": "video_url", "video_url": {"url": data_url(clip, "video/mp4")}}]
        answer = chat.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}], **kwargs
        )
        return answer.choices[0].message.content

    sound = {"extra_body": {"mm_processor_kwargs": {"use_audio_in_video": True}}}
    assert ask("sounding", video_with_sound(10), **sound) == "1 video(s) as audio+text+video"
    assert ask("sounding", video_with_sound(10)) == "1 video(s) as text+video"
    with pytest.raises(
        openai.BadRequestError, match="app 'clips' does not accept audio input, which use_audio_in_video"
    ):
        ask("clips", video_with_sound(10), **sound)
    with pytest.raises(
        openai.BadRequestError, match="video #0 has no soundtrack, which use_audio_in_video asks for"
    ):
        ask("sounding", video_clip("mp4", 10), **sound)
    with pytest.raises(
        openai.BadRequestError,
        match="mm_processor_kwargs.fps: not supported: prismserve cannot honour this parameter",
    ):
        ask("sounding", video_with_sound(10), extra_body={"mm_processor_kwargs": {"fps": 4}})
    assert ask("clips", video_clip("mp4", 10)) == "1 video(s) as text+video"  # still serving


def test_openai_unknown_model_is_404(chat):
    with pytest.raises(openai.NotFoundError, match="no app named 'gpt-4'") as missing:
        chat.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "model_not_found"


def test_max_tokens_beyond_the_apps_context_is_a_400_context_length_exceeded(chat):
    """The toy Omni app states a 2,048-token context: a reply that long cannot fit beside any prompt."""
    messages = [{"role": "user", "content": "hi"}]
    for field in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai.BadRequestError, match="ask for at most 2047") as refused:
            chat.chat.completions.create(model="omni", messages=messages, **{field: 2048})
        assert refused.value.code == "context_length_exceeded" and refused.value.status_code == 400
    assert chat.chat.completions.create(model="omni", messages=messages, max_tokens=2047).choices


# --- health and metrics -------------------------------------------------------------------------


@pytest.mark.fresh_gateway  # counts from zero
def test_metrics_count_requests_per_app_request_type_and_status(gateway):
    gateway.post("/v1/apps/answer/invoke", json=chat_body("one"))
    gateway.post("/v1/apps/answer/invoke", json=chat_body("please crash"))
    image_body = {
        "messages": [
            {"role": "user", "content": [{"type": "image", "data": base64.b64encode(png()).decode()}]}
        ]
    }
    gateway.post("/v1/apps/answer/invoke", json=image_body)
    with gateway.stream("POST", "/v1/apps/omni/invoke", json=chat_body("streamed")) as response:
        list(response.iter_lines())
    spoken = {
        "model": "omni",
        "modalities": ["text", "audio"],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "input_audio", "input_audio": {"data": b64(wav()), "format": "wav"}}],
            }
        ],
    }
    assert gateway.post("/v1/chat/completions", json=spoken).status_code == 200
    assert gateway.post("/v1/apps/embed/invoke", json={"data": "x"}).status_code == 200
    text = gateway.get("/metrics").text
    assert 'prismserve_requests_total{app="answer",request_type="text",status="ok"} 1.0' in text
    assert 'prismserve_requests_total{app="answer",request_type="text",status="error"} 1.0' in text
    assert 'prismserve_requests_total{app="answer",request_type="image+text",status="ok"} 1.0' in text
    assert 'prismserve_request_latency_seconds_count{app="omni",request_type="text"} 1.0' in text
    assert 'prismserve_time_to_first_chunk_seconds_count{app="omni",request_type="text"} 1.0' in text
    assert 'prismserve_requests_total{app="omni",request_type="audio+text->audio",status="ok"} 1.0' in text
    assert 'prismserve_requests_total{app="embed",request_type="default",status="ok"} 1.0' in text
    assert "prismserve_apps_registered 3.0" in text
