"""Bad input is the client's error on every route, and no error costs the client its connection or
shows it the server's internals (found by fuzzing the gateway)."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from gateway_apps import (
    ADMIN,
    GARBLED_ANSWER,
    GARBLED_STREAM,
    RAY_INTERNALS,
    TOKEN,
    b64,
    bomb_png,
    chat_body,
    data_url,
    sse_events,
)
from toy.executors import EXECUTORS

from prismserve.gateway import create_gateway
from prismserve.models.base import MediaError
from prismserve.models.media import load_image, load_video_frames
from prismserve.runtime import LocalRuntime

JSON = {"content-type": "application/json"}

JSON_ROUTES = [
    "/v1/apps/answer/invoke",  # a chat app
    "/v1/apps/embed/invoke",  # an app with its own request type
    "/v1/apps/omni/invoke",  # a streaming app
    "/v1/chat/completions",
    "/v1/images/generations",
    "/admin/apps",
    "/admin/apps/omni/plan",
]

SURROGATE_CHAT = b'{"model": "answer", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
SURROGATE_INVOKE = b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi \\ud800"}]}]}'


def local_port(response: httpx.Response) -> int:
    """The client-side port of the connection that carried `response`."""
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


@pytest.mark.parametrize(
    "body, reason",
    [
        (b"[" * 1000 + b"]" * 1000, "recursion limit exceeded"),
        (b'{"seed": ' + b"7" * 5000 + b"}", "number out of range"),
        (b'{"text": "\\ud800"}', "hex escape"),
        (b'{"text": "\\udc00 alone"}', "lone leading surrogate"),
        (b'{"text": "\xed\xa0\x80"}', "invalid unicode code point"),
    ],
    ids=["nested-1000-deep", "5000-digits", "lone-surrogate", "lone-low-surrogate", "surrogate-as-utf8"],
)
def test_json_the_parser_refuses_is_the_same_400_on_every_route(gateway, body, reason):
    answers = {route: gateway.post(route, content=body, headers={**JSON, **ADMIN}) for route in JSON_ROUTES}
    assert {route: r.status_code for route, r in answers.items()} == {route: 400 for route in JSON_ROUTES}
    messages = {r.json()["error"]["message"] for r in answers.values()}
    assert len(messages) == 1, messages
    (message,) = messages
    assert message.startswith("malformed JSON: ") and reason in message
    assert gateway.post("/v1/apps/answer/invoke", json=chat_body("still serving")).status_code == 200


def test_a_lone_surrogate_in_a_message_is_a_400_on_chat_and_before_the_invoke_stream(gateway):
    chat = gateway.post("/v1/chat/completions", content=SURROGATE_CHAT, headers=JSON)
    assert chat.status_code == 400 and "surrogate needs its pair" in chat.json()["error"]["message"]
    with gateway.stream("POST", "/v1/apps/omni/invoke", content=SURROGATE_INVOKE, headers=JSON) as stream:
        assert stream.status_code == 400  # refused before the stream starts, not a stream that ends silently
        stream.read()
    assert "surrogate needs its pair" in stream.json()["error"]["message"]
    assert gateway.post("/v1/apps/answer/invoke", json=chat_body("still serving")).status_code == 200


@pytest.mark.parametrize("kind", [["image"], {"image": 1}], ids=["list", "object"])
def test_a_content_part_type_that_is_not_a_string_is_a_400_on_both_apis(gateway, kind):
    invoke = gateway.post(
        "/v1/apps/answer/invoke",
        json={"messages": [{"role": "user", "content": [{"type": kind, "data": "AAAA"}]}]},
    )
    assert (
        invoke.status_code == 400
        and "does not match any of the expected tags" in invoke.json()["error"]["message"]
    )
    chat = gateway.post(
        "/v1/chat/completions",
        json={"model": "answer", "messages": [{"role": "user", "content": [{"type": kind}]}]},
    )
    assert (
        chat.status_code == 400
        and "messages.0.content.0: Input tag" in chat.json()["error"]["message"]
        and "does not match any of the expected tags" in chat.json()["error"]["message"]
    )


def test_an_image_claiming_100000_by_100000_pixels_is_a_400_on_both_apis(gateway):
    invoke = gateway.post(
        "/v1/apps/answer/invoke",
        json={"messages": [{"role": "user", "content": [{"type": "image", "data": b64(bomb_png())}]}]},
    )
    chat = gateway.post(
        "/v1/chat/completions",
        json={
            "model": "omni",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": data_url(bomb_png())}}],
                }
            ],
        },
    )
    for response in (invoke, chat):
        assert response.status_code == 400
        message = response.json()["error"]["message"]
        assert message.startswith("image #0 is too large to decode: Image size (10000000000 pixels)")
        assert message.endswith("Send a smaller image.")


def test_the_encoders_media_decoding_refuses_a_decompression_bomb_as_media_error():
    with pytest.raises(MediaError, match=r"image too large to decode: Image size \(10000000000 pixels\)"):
        load_image(bomb_png())
    with pytest.raises(
        MediaError, match=r"video frames too large to decode: Image size \(10000000000 pixels\)"
    ):
        load_video_frames(bomb_png(), 4)


@pytest.mark.parametrize("body", [b"[]", b'"text"', b"{}", b'{"model": 7, "name": 7, "cells": 7}'])
def test_fields_that_do_not_validate_are_the_same_400_on_every_route(gateway, body):
    answers = {route: gateway.post(route, content=body, headers={**JSON, **ADMIN}) for route in JSON_ROUTES}
    assert {route: r.status_code for route, r in answers.items()} == {route: 400 for route in JSON_ROUTES}
    assert {r.json()["error"]["type"] for r in answers.values()} == {"invalid_request_error"}
    assert all(
        "Input should be" in r.json()["error"]["message"] or "Field required" in r.json()["error"]["message"]
        for r in answers.values()
    ), {route: r.json() for route, r in answers.items()}


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
@pytest.mark.parametrize("route", JSON_ROUTES)
def test_a_body_that_is_not_declared_json_is_415_naming_the_type_expected(gateway, route, content_type):
    refused = gateway.post(
        route, content=json.dumps(chat_body("hi")), headers={"content-type": content_type, **ADMIN}
    )
    assert refused.status_code == 415
    assert refused.json()["error"]["message"] == (
        f"Content-Type {content_type!r} is not accepted: send the body as JSON with Content-Type: application/json"
    )


@pytest.mark.parametrize(
    "content_type", [None, "application/json", "application/json; charset=utf-8", "application/vnd.api+json"]
)
def test_json_bodies_are_accepted_with_a_json_content_type_or_none(gateway, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    request = gateway.build_request(
        "POST", "/v1/apps/answer/invoke", content=json.dumps(chat_body("hi")), headers=headers
    )
    assert request.headers.get("content-type") == content_type  # httpx adds none for raw content
    response = gateway.send(request)
    assert response.status_code == 200, response.text


def test_an_internal_error_is_a_500_that_leaves_the_keep_alive_connection_usable(gateway):
    assert (
        gateway.post(
            "/admin/apps", json={"name": "garbled", "source": GARBLED_ANSWER}, headers=ADMIN
        ).status_code
        == 201
    )
    before = gateway.get("/health")
    failed = gateway.post("/v1/apps/garbled/invoke", json=chat_body("hi"))  # the answer cannot be encoded
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "internal_error"
    assert failed.headers.get("connection") != "close"
    executor_failed = gateway.post("/v1/apps/answer/invoke", json=chat_body("please crash"))
    assert executor_failed.status_code == 502
    after = gateway.post("/v1/apps/answer/invoke", json=chat_body("next"))
    assert after.status_code == 200
    # One connection carried all four: the server did not drop it after the errors.
    assert {local_port(r) for r in (before, failed, executor_failed, after)} == {local_port(before)}


def test_an_error_mid_stream_that_is_not_an_http_error_still_ends_with_an_error_event(gateway):
    assert (
        gateway.post(
            "/admin/apps", json={"name": "garbled", "source": GARBLED_STREAM}, headers=ADMIN
        ).status_code
        == 201
    )
    with gateway.stream("POST", "/v1/apps/garbled/invoke", json=chat_body("hi")) as response:
        assert response.status_code == 200
        events = sse_events(response.iter_lines())
    assert [json.loads(data)["text"] for event, data in events if event is None] == ["fine"]
    [(_, data)] = [e for e in events if e[0] == "error"]
    error = json.loads(data)["error"]
    assert error["code"] is None and error["request_id"] == response.headers["x-request-id"]
    assert error["message"].startswith("app 'garbled' failed (PydanticSerializationError)")
    assert gateway.post("/v1/apps/answer/invoke", json=chat_body("next")).status_code == 200


# --- internals stay in the log ----------------------------------------------------------------------


def assert_hidden_but_logged(message: str, request_id: str, caplog) -> None:
    """`message` (what the client got) names no internals and points at the log, which has them."""
    assert not [secret for secret in RAY_INTERNALS if secret in message], message
    assert f"the gateway's log has the details under request id {request_id}" in message
    logged = [r.getMessage() for r in caplog.records if request_id in r.getMessage()]
    assert logged and all(secret in logged[0] for secret in RAY_INTERNALS), logged


def test_an_executor_failure_shows_the_component_not_ray_internals_which_go_to_the_log(gateway, caplog):
    caplog.set_level(logging.ERROR, logger="prismserve.gateway")
    failed = gateway.post(
        "/v1/apps/answer/invoke", json=chat_body("crash on ray"), headers={"x-request-id": "leak-1"}
    )
    assert failed.status_code == 502 and failed.headers["x-request-id"] == "leak-1"
    error = failed.json()["error"]
    assert error["request_id"] == "leak-1" and error["type"] == "executor_error"
    assert error["message"].startswith("app 'answer': call #0 (LLMTask) failed;")
    assert_hidden_but_logged(error["message"], "leak-1", caplog)

    chat = gateway.post(
        "/v1/chat/completions",
        json={"model": "answer", "messages": [{"role": "user", "content": "crash on ray"}]},
    )
    assert chat.status_code == 502
    assert_hidden_but_logged(chat.json()["error"]["message"], chat.headers["x-request-id"], caplog)


@pytest.mark.parametrize("route", ["/v1/apps/omni/invoke", "/v1/chat/completions"])
def test_a_failure_mid_stream_shows_the_component_not_ray_internals(gateway, caplog, route):
    caplog.set_level(logging.ERROR, logger="prismserve.gateway")
    body = {"model": "omni", "stream": True, "messages": [{"role": "user", "content": "midway on ray"}]}
    if route.endswith("invoke"):
        body = chat_body("midway on ray")
    with gateway.stream("POST", route, json=body) as response:
        events = sse_events(response.iter_lines())
    [(_, data)] = [e for e in events if e[0] == "error"]
    error = json.loads(data)["error"]
    assert error["type"] == "executor_error" and "(LLMTask) failed;" in error["message"]
    assert_hidden_but_logged(error["message"], response.headers["x-request-id"], caplog)


class _BrokenRuntime(LocalRuntime):
    """A runtime whose status read fails with a Ray-like text: a bug in the gateway's reach."""

    def status(self):
        raise RuntimeError(f"GCS lookup failed for {', '.join(RAY_INTERNALS)}")


def test_an_unexpected_gateway_error_is_a_generic_500_with_the_details_in_the_log(serve_gateway, caplog):
    caplog.set_level(logging.ERROR, logger="prismserve.gateway")
    app = create_gateway(_BrokenRuntime(EXECUTORS), admin_token=TOKEN)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        failed = client.get("/admin/status", headers=ADMIN)
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error["type"] == "internal_error" and error["message"].startswith(
            "the gateway failed (RuntimeError);"
        )
        assert_hidden_but_logged(error["message"], failed.headers["x-request-id"], caplog)
        assert client.get("/health").status_code == 200


def test_every_error_carries_the_request_id_in_its_body_and_header(gateway):
    for response in (
        gateway.get("/v1/nothing-here"),
        gateway.post("/v1/apps/nope/invoke", json={}),
        gateway.post("/v1/apps/answer/invoke", content=b"{oops", headers={**JSON, "x-request-id": "mine-7"}),
    ):
        assert response.json()["error"]["request_id"] == response.headers["x-request-id"]
    assert response.headers["x-request-id"] == "mine-7"


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi", "name": "ann"}]},
            "messages.0.name",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "x", "detail": "high"}}],
                    }
                ]
            },
            "detail",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "audio": {"speed": 2}},
            "audio.speed",
        ),
        ("/v1/images/generations", {"prompt": "a cat", "quality": "hd"}, "quality"),
        ("/v1/audio/speech", {"input": "hi", "voice": "Chelsie", "language": "fr"}, "language"),
    ],
    ids=["message-name", "image-detail", "audio-option", "image-quality", "speech-field"],
)
def test_a_field_the_api_does_not_honour_is_a_400_naming_it_on_every_route(gateway, route, body, field):
    """Nothing a client sends is accepted and ignored: an unknown field, at any depth, is refused."""
    response = gateway.post(route, json={"model": "omni", **body})
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"]
    assert gateway.get("/health").status_code == 200
