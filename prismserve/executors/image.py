"""Image-model executors (diffusers): the text encoder alone, and the generator (DiT + VAE) fed with
the prompt's conditioning or, as the monolith, with the prompt itself."""

from __future__ import annotations

import asyncio
from typing import Any

from prismserve.executors.base import Executor
from prismserve.executors.loading import model_adapter
from prismserve.task import InvalidInputError
from prismserve.tasklib.units import (
    ImageGeneratorTask,
    ImageGenInput,
    ImageOutput,
    PromptEmbeddings,
    PromptInput,
    TextEncoderTask,
)


class TextEncoderExecutor(Executor):
    """Encodes prompts for an image generator."""

    task: TextEncoderTask

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        await asyncio.to_thread(self.adapter.load_text_encoder)

    async def run(self, task_input: Any) -> PromptEmbeddings:
        request = PromptInput.model_validate(task_input)
        return PromptEmbeddings(embeds=await asyncio.to_thread(self.adapter.encode_prompt, request.prompt))


class ImageGeneratorExecutor(Executor):
    """Generates one image per call, one call at a time."""

    task: ImageGeneratorTask

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        loading = self.adapter.load_monolith if self.task.with_text_encoder else self.adapter.load_generator
        await asyncio.to_thread(loading)

    async def run(self, task_input: Any) -> ImageOutput:
        request = ImageGenInput.model_validate(task_input)
        if self.task.with_text_encoder == (request.prompt is None):
            held = (
                "holds the text encoder: send the prompt"
                if self.task.with_text_encoder
                else "has no text encoder: send embeddings"
            )
            raise InvalidInputError(f"this deployment of {self.task.model} {held}")
        image = await asyncio.to_thread(
            self.adapter.generate,
            request.prompt,
            request.embeds.value if request.embeds is not None else None,
            request.negative.value if request.negative is not None else None,
            width=request.width,
            height=request.height,
            steps=request.steps,
            seed=request.seed,
            guidance=request.guidance,
            negative_prompt=request.negative_prompt,
        )
        return ImageOutput(image=image)
