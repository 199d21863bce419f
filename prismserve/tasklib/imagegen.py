"""ImageGenTask: text encoder and image generator (Qwen-Image), split or whole."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from prismserve.protocol.images import ImageRequest, ImageResponse
from prismserve.task import DataHandle, Task, TaskOutput, replayable_choice
from prismserve.tasklib.gpus import component_gpus
from prismserve.tasklib.units import Dtype, ImageGeneratorTask, ImageGenInput, PromptInput, TextEncoderTask


class ImagesOutput(TaskOutput):
    """The generated PNG images."""

    images: list[DataHandle[bytes]]


class ImageGenTask(Task[ImageRequest, ImagesOutput]):
    """Text to image. With `text_encoder_fission` the prompt (and the negative prompt, concurrently)
    go to the text encoder's deployment and the generator gets their conditioning; without, one
    deployment runs the whole pipeline. Image i of a request uses seed `seed + i` (a random seed,
    drawn once per request, when the request names none). `gpus` sets the GPUs per replica of
    components (`{"text_encoder": 0.3, "generator": 0.7}`); `dtype` the weights' dtype of both
    (`ModelSettings.dtype`)."""

    model: str
    text_encoder_fission: bool = True
    dtype: Dtype = "auto"
    # GPUs per replica by component: "text_encoder", "generator".
    gpus: dict[str, float] = Field(default_factory=dict)

    def post_init(self) -> None:
        split = {"text_encoder": TextEncoderTask} if self.text_encoder_fission else {}
        owner = f"ImageGenTask(text_encoder_fission={self.text_encoder_fission})"
        shares = component_gpus(owner, self.gpus, {**split, "generator": ImageGeneratorTask})
        if self.text_encoder_fission:
            self.text_encoder = TextEncoderTask(
                model=self.model, gpus=shares["text_encoder"], dtype=self.dtype
            )
        self.generator = ImageGeneratorTask(
            model=self.model,
            with_text_encoder=not self.text_encoder_fission,
            gpus=shares["generator"],
            dtype=self.dtype,
        )

    def invoke(self, request: ImageRequest) -> ImagesOutput:
        seed = request.seed if request.seed is not None else replayable_choice(2**31)
        shape: dict[str, Any] = {
            "width": request.width,
            "height": request.height,
            "steps": request.steps,
            "guidance": request.guidance,
        }
        if self.text_encoder_fission:
            embeds = self.text_encoder.invoke(PromptInput(prompt=request.prompt)).embeds
            negative = None
            if request.negative_prompt:
                negative = self.text_encoder.invoke(PromptInput(prompt=request.negative_prompt)).embeds
            prompt: dict[str, Any] = {"embeds": embeds, "negative": negative}
        else:
            prompt = {"prompt": request.prompt, "negative_prompt": request.negative_prompt}
        images = [
            self.generator.invoke(ImageGenInput(**prompt, **shape, seed=seed + i)).image
            for i in range(request.n)
        ]
        return ImagesOutput(images=images)


async def image_response(output: ImagesOutput) -> ImageResponse:
    """The images as `/v1/images/generations` returns them (fetched from the generator's replicas)."""
    return ImageResponse(images=[await handle.fetch() for handle in output.images])
