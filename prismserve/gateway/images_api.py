"""OpenAI-compatible POST /v1/images/generations for apps whose serve() takes an `ImageRequest`.

`model` names the app; `size` is `WIDTHxHEIGHT` (multiples of 16); images come back as `b64_json`
PNGs (there is no image store to serve `url`s from). Extensions: `negative_prompt`, `seed`,
`num_inference_steps`, `guidance_scale`.
"""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from prismserve.gateway.errors import HTTPError, validation_message
from prismserve.gateway.http import parse_json, read_body, state
from prismserve.gateway.serving import find_app, serving
from prismserve.protocol.images import ImageRequest, ImageResponse

router = APIRouter()


class OpenAIImageRequest(BaseModel):
    """The fields of OpenAI's image-generation request that prismserve reads (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    prompt: str
    n: int = 1
    size: str = "auto"
    response_format: Literal["b64_json", "url"] = "b64_json"
    negative_prompt: str | None = None
    seed: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None

    def to_image_request(self) -> ImageRequest:
        """The app's ImageRequest; 400 for a size or field it cannot take."""
        fields: dict[str, Any] = {
            "prompt": self.prompt,
            "n": self.n,
            "negative_prompt": self.negative_prompt,
            "seed": self.seed,
        }
        if self.size != "auto":
            width, _, height = self.size.partition("x")
            if not (width.isdigit() and height.isdigit()):
                raise HTTPError(
                    400, f"size must be WIDTHxHEIGHT (for example 512x512) or auto, got {self.size!r}"
                )
            fields.update(width=int(width), height=int(height))
        if self.num_inference_steps is not None:
            fields["steps"] = self.num_inference_steps
        if self.guidance_scale is not None:
            fields["guidance"] = self.guidance_scale
        try:
            return ImageRequest.model_validate(fields)
        except ValidationError as exc:
            raise HTTPError(400, validation_message(exc)) from None


@router.post("/v1/images/generations")
async def images_generations(request: Request) -> JSONResponse:
    """OpenAI image generation, served by the app named in `model`."""
    try:
        body = OpenAIImageRequest.model_validate(parse_json(await read_body(request)))
    except ValidationError as exc:
        raise HTTPError(400, validation_message(exc)) from None
    app = find_app(state(request).runtime, body.model)
    if not (isinstance(app.request_type, type) and issubclass(app.request_type, ImageRequest)):
        raise HTTPError(
            400, f"app {app.name!r} does not generate images (its serve() takes {app.request_type.__name__})"
        )
    if body.response_format == "url":
        raise HTTPError(
            400, "response_format 'url' is not supported: prismserve keeps no image store; use b64_json"
        )
    served = serving(request, app, body.to_image_request())
    result = await served.response()
    if not isinstance(result, ImageResponse):
        raise HTTPError(
            500, f"app {app.name!r} answered with {type(result).__name__}, not ImageResponse", "app_error"
        )
    data = [{"b64_json": base64.b64encode(image).decode(), "revised_prompt": None} for image in result.images]
    return JSONResponse({"created": int(time.time()), "data": data})
