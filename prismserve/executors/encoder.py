"""EncoderExecutor: a checkpoint's multimodal encoder alone, batching concurrent items (transformers)."""

from __future__ import annotations

import asyncio
from typing import Any

from prismserve.executors.base import AsyncBatcher, Executor, media_rejected
from prismserve.executors.loading import model_adapter
from prismserve.models import Encoded
from prismserve.task import DataHandle, InvalidInputError
from prismserve.task.components import EncoderOutput, EncoderSettings, MediaItem


class EncoderExecutor(Executor[EncoderSettings, MediaItem, EncoderOutput]):
    """Encodes media items of one modality; concurrent calls share one encoder forward pass."""

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        await asyncio.to_thread(self.adapter.load_encoder, self.task.modality)
        self.batcher: AsyncBatcher[MediaItem, Encoded | Exception] = AsyncBatcher(
            self._encode, self.task.max_batch
        )

    async def _encode(self, items: list[MediaItem]) -> list[Encoded | Exception]:
        try:
            return await asyncio.to_thread(self.adapter.encode, self.task.modality, [i.data for i in items])
        except Exception:  # noqa: BLE001 - find the bad items: only their callers fail
            if len(items) == 1:
                raise
            return [await self._one(item) for item in items]

    async def _one(self, item: MediaItem) -> Encoded | Exception:
        try:
            (encoded,) = await asyncio.to_thread(self.adapter.encode, self.task.modality, [item.data])
            return encoded
        except Exception as exc:  # noqa: BLE001 - returned to this item's caller
            return exc

    async def run(self, task_input: Any) -> EncoderOutput:
        item = MediaItem.model_validate(task_input)
        if item.modality != self.task.modality:
            raise InvalidInputError(
                f"the {self.task.modality} encoder of {self.task.model} got a {item.modality} item"
            )
        with media_rejected():
            result = await self.batcher.submit(item)
            if isinstance(result, Exception):
                raise result
        return EncoderOutput(embeddings=DataHandle.wrap(result.embeddings), meta=DataHandle.wrap(result.meta))
