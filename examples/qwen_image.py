"""Qwen-Image: the text encoder fissioned from the DiT + VAE generator (`/v1/images/generations`).

To serve the model as it is, no app file is needed: `prismserve serve Qwen/Qwen-Image` (or a checkpoint
directory) builds this same composition. This file is a starting point for other compositions.

MODEL: a diffusers checkpoint directory or hub id, from $PRISMSERVE_MODEL (a tiny one: `prismserve
tiny qwen-image` prints its path). $PRISMSERVE_MONOLITH=1 serves the whole pipeline in one deployment.
"""

import os

from prismserve.app import AppConfig
from prismserve.protocol.images import ImageRequest, ImageResponse
from prismserve.tasklib.imagegen import ImageGenTask, image_response

MODEL = os.environ.get("PRISMSERVE_MODEL", "Qwen/Qwen-Image")
image = ImageGenTask(model=MODEL, text_encoder_fission=os.environ.get("PRISMSERVE_MONOLITH") != "1")


class Config(AppConfig):
    tasks = {"image": image}


async def serve(request: ImageRequest) -> ImageResponse:
    return await image_response(await image(request))
