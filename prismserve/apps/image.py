"""The image app of a diffusers text-to-image model: one `ImageGenTask`, the text encoder fissioned
from the DiT + VAE generator, over `/v1/images/generations` (Qwen-Image's default app).

`prismserve serve MODEL` serves this module with `SETTINGS` written for the checkpoint and the engine
flags; `prismserve serve MODEL --write-app app.py` writes that copy, to edit and serve as an app file.
"""

from prismserve.app import AppConfig
from prismserve.apps.settings import ImageAppSettings
from prismserve.protocol.images import ImageRequest, ImageResponse
from prismserve.tasklib.imagegen import ImageGenTask, image_response

# The app's parameters, in one statement (`prismserve serve MODEL` writes it for the checkpoint and flags).
SETTINGS = ImageAppSettings(
    model="Qwen/Qwen-Image",
)

MODEL = SETTINGS.model
model = ImageGenTask(model=MODEL, text_encoder_fission=True, gpus=SETTINGS.gpus, dtype=SETTINGS.dtype)


class Config(AppConfig):
    tasks = {"model": model}


async def serve(request: ImageRequest) -> ImageResponse:
    return await image_response(await model(request))
