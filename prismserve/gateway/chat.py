"""Chat requests at the API boundary: media decoded and checked, modalities checked against the app.

Both the invoke API (an app's ChatRequest as JSON, media as base64) and the OpenAI API end here,
so an undecodable image or a modality the app does not take is refused the same way by both.
"""

from __future__ import annotations

from pydantic import ValidationError

from prismserve.app import App
from prismserve.errors import InvalidRequestError
from prismserve.gateway.errors import invalid
from prismserve.gateway.http import parse_json
from prismserve.gateway.media import check_audio, check_image, check_soundtrack, decode_base64
from prismserve.protocol.chat import ChatRequest


def speaks_chat(app: App) -> bool:
    """True when the app's serve() takes a ChatRequest (or a subclass)."""
    return isinstance(app.request_model, type) and issubclass(app.request_model, ChatRequest)


def parse_chat_json(app: App, body: bytes) -> ChatRequest:
    """The invoke API's JSON as the app's ChatRequest: image and audio `data` are base64."""
    payload = parse_json(body)
    if isinstance(payload, dict) and isinstance(payload.get("messages"), list):
        kinds = {"image": 0, "audio": 0}
        for i, message in enumerate(payload["messages"]):
            content = message.get("content") if isinstance(message, dict) else None
            for j, part in enumerate(content if isinstance(content, list) else []):
                kind = (
                    part.get("type") if isinstance(part, dict) else None
                )  # any JSON value; only a str is a key
                if isinstance(kind, str) and kind in kinds and isinstance(part.get("data"), str):
                    part["data"] = decode_base64(
                        part["data"], f"{kind} #{kinds[kind]} (messages.{i}.content.{j}.data)"
                    )
                    kinds[kind] += 1
    return chat_request(app, payload, f"invalid request for app {app.name!r}: ")


def chat_request(app: App, fields: object, prefix: str = "") -> ChatRequest:
    """The app's ChatRequest of `fields`, checked (`check_chat_request`); a 400 whose message starts
    with `prefix` if it does not validate."""
    try:
        request: ChatRequest = app.request_model.model_validate(fields)  # type: ignore[assignment]
    except ValidationError as exc:
        raise invalid(exc, prefix) from None
    check_chat_request(app, request)
    return request


def check_chat_request(app: App, request: ChatRequest) -> None:
    """A 400 unless the app takes the modalities asked for and every image and audio clip decodes."""
    accepted, produced = app.config.input_modalities, app.config.output_modalities
    for kind, parts in (("image", request.images), ("audio", request.audios), ("video", request.videos)):
        if parts and kind not in accepted:
            raise InvalidRequestError(
                f"app {app.name!r} does not accept {kind} input (it accepts {_listed(accepted)})"
            )
    for kind in request.modalities:
        if kind not in produced:
            raise InvalidRequestError(
                f"app {app.name!r} does not produce {kind} output (it produces {_listed(produced)})"
            )
    for index, image in enumerate(request.images):
        check_image(image.data, index)
    for index, audio in enumerate(request.audios):
        check_audio(audio.data, audio.format, index)
    if request.use_audio_in_video and request.videos:
        if "audio" not in accepted:
            raise InvalidRequestError(
                f"app {app.name!r} does not accept audio input, which use_audio_in_video sends "
                f"(each video's soundtrack; it accepts {_listed(accepted)})"
            )
        for index, video in enumerate(request.videos):
            check_soundtrack(video.data, index)


def _listed(kinds: frozenset[str]) -> str:
    return ", ".join(sorted(kinds))
