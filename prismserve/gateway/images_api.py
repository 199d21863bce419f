"""OpenAI-compatible POST /v1/images/generations for apps whose serve() takes an `ImageRequest`.

`model` names the app; `size` is `WIDTHxHEIGHT` (multiples of 16); images come back as `b64_json`
PNGs (there is no image store to serve `url`s from). Extensions: `negative_prompt`, `seed`,
`num_inference_steps`, `guidance_scale`.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from prismserve.errors import AppResponseError, InvalidRequestError
from prismserve.gateway.errors import invalid
from prismserve.gateway.http import read_model, state
from prismserve.gateway.openapi import errors, json_body
from prismserve.gateway.serving import find_app, serving
from prismserve.protocol.images import ImageRequest, ImageResponse
from prismserve.protocol.openai import ImagesAnswer, OpenAIImageRequest

router = APIRouter()


def to_image_request(body: OpenAIImageRequest) -> ImageRequest:
    """The app's ImageRequest for an OpenAI request; 400 for a size or field it cannot take."""
    fields: dict[str, Any] = {
        "prompt": body.prompt,
        "n": body.n,
        "negative_prompt": body.negative_prompt,
        "seed": body.seed,
    }
    if body.size != "auto":
        width, _, height = body.size.partition("x")
        if not (width.isdigit() and height.isdigit()):
            raise InvalidRequestError(
                f"size must be WIDTHxHEIGHT (for example 512x512) or auto, got {body.size!r}"
            )
        fields.update(width=int(width), height=int(height))
    if body.num_inference_steps is not None:
        fields["steps"] = body.num_inference_steps
    if body.guidance_scale is not None:
        fields["guidance"] = body.guidance_scale
    try:
        return ImageRequest.model_validate(fields)
    except ValidationError as exc:
        raise invalid(exc) from None


@router.post(
    "/v1/images/generations",
    response_model=ImagesAnswer,
    openapi_extra=json_body(OpenAIImageRequest),
    responses=errors(400, 404, 413, 415, 500, 502),
)
async def images_generations(request: Request) -> JSONResponse:
    """OpenAI image generation, served by the app named in `model`."""
    body = await read_model(request, OpenAIImageRequest)
    app = find_app(state(request).runtime, body.model)
    if not (isinstance(app.request_model, type) and issubclass(app.request_model, ImageRequest)):
        raise InvalidRequestError(
            f"app {app.name!r} does not generate images (its serve() takes {app.request_model.__name__})"
        )
    if body.response_format == "url":
        raise InvalidRequestError(
            "response_format 'url' is not supported: prismserve keeps no image store; use b64_json"
        )
    served = serving(request, app, to_image_request(body))
    result = await served.response()
    if not isinstance(result, ImageResponse):
        raise AppResponseError(f"app {app.name!r} answered with {type(result).__name__}, not ImageResponse")
    data = [{"b64_json": base64.b64encode(image).decode(), "revised_prompt": None} for image in result.images]
    return JSONResponse({"created": int(time.time()), "data": data})
