"""The image-generation wire types: what apps behind `/v1/images/generations` take and return."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

_BASE64 = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")


class ImageRequest(BaseModel):
    """Generate `n` images of `width` x `height` pixels from a prompt."""

    prompt: str = Field(min_length=1, max_length=4000)
    negative_prompt: str | None = None
    n: int = Field(default=1, ge=1, le=4)
    width: int = Field(default=512, ge=16, le=2048)
    height: int = Field(default=512, ge=16, le=2048)
    steps: int = Field(default=30, ge=1, le=200)
    guidance: float = Field(default=4.0, ge=1.0, le=20.0)
    seed: int | None = None

    @model_validator(mode="after")
    def _multiple_of_16(self) -> ImageRequest:
        if self.width % 16 or self.height % 16:
            raise ValueError(f"width and height must be multiples of 16, got {self.width}x{self.height}")
        return self

    @property
    def request_type(self) -> str:
        """The request's type for plans and metrics."""
        return "text->image"


class ImageResponse(BaseModel):
    """The generated images, PNG-encoded."""

    model_config = _BASE64

    images: list[bytes]
