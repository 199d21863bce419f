"""Image-model executors (diffusers): the text encoder alone, and the generator (DiT + VAE) fed with
the prompt's conditioning or, as the monolith, with the prompt itself."""

from __future__ import annotations

import asyncio
from typing import Any

from prismserve.executors.base import AsyncBatcher, Executor
from prismserve.executors.loading import model_adapter
from prismserve.models.base import ThreadBatcher
from prismserve.models.qwen_image import Painting
from prismserve.task import DataHandle, InvalidInputError
from prismserve.task.components import (
    ImageGeneratorSettings,
    ImageGenInput,
    ImageOutput,
    ModelSettings,
    PromptEmbeddings,
    PromptInput,
)


class TextEncoderExecutor(Executor[ModelSettings, PromptInput, PromptEmbeddings]):
    """Encodes prompts for an image generator; concurrent prompts share one forward pass."""

    max_batch = 8

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        await asyncio.to_thread(self.adapter.load_text_encoder)
        self.batcher: AsyncBatcher[str, Any] = AsyncBatcher(self._encode, self.max_batch)

    async def _encode(self, prompts: list[str]) -> list[Any]:
        return await asyncio.to_thread(self.adapter.encode_prompts, prompts)

    async def run(self, task_input: Any) -> PromptEmbeddings:
        request = PromptInput.model_validate(task_input)
        return PromptEmbeddings(embeds=await self.batcher.submit(request.prompt))


class ImageGeneratorExecutor(Executor[ImageGeneratorSettings, ImageGenInput, ImageOutput]):
    """Generates one image per call; concurrent calls of one size, number of steps and guidance are
    painted in one pipeline call (each from its own seed)."""

    max_batch = 4

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        loading = self.adapter.load_monolith if self.task.with_text_encoder else self.adapter.load_generator
        await asyncio.to_thread(loading)
        # Keyed by kind: waiting paintings of one kind share a call, the oldest kind's first.
        self.painter = ThreadBatcher(lambda kind, paintings: self.adapter.paint(paintings), self.max_batch)

    async def run(self, task_input: Any) -> ImageOutput:
        request = ImageGenInput.model_validate(task_input)
        if self.task.with_text_encoder == (request.prompt is None):
            held = (
                "holds the text encoder: send the prompt"
                if self.task.with_text_encoder
                else "has no text encoder: send embeddings"
            )
            raise InvalidInputError(f"this deployment of {self.task.model} {held}")
        painting = Painting(
            width=request.width,
            height=request.height,
            steps=request.steps,
            seed=request.seed,
            guidance=request.guidance,
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            embeds=request.embeds.value if request.embeds is not None else None,
            negative=request.negative.value if request.negative is not None else None,
        )
        image = await asyncio.to_thread(self.painter, painting.kind, painting)
        return ImageOutput(image=DataHandle.wrap(image))
