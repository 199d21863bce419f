"""EncoderExecutor: a checkpoint's multimodal encoder alone, batching concurrent items (transformers)."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from prismserve.executors.base import AsyncBatcher, Executor, media_rejected
from prismserve.executors.loading import model_adapter
from prismserve.models import Encoded
from prismserve.task import DataHandle, InvalidInputError
from prismserve.task.components import EncoderOutput, EncoderSettings, MediaItem


class EncodedCache:
    """Encoder outputs by their item's content hash, at most `limit` bytes of embeddings; the least
    recently used go first. Items being encoded are shared too: a second call for the same item
    waits for the first's output instead of encoding it again."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size = limit, 0
        self.hits = self.misses = 0
        self._entries: OrderedDict[bytes, Encoded] = OrderedDict()
        self._pending: dict[bytes, asyncio.Future[Encoded | Exception]] = {}

    async def get(
        self, data: bytes, encode: Callable[[], Awaitable[Encoded | Exception]]
    ) -> Encoded | Exception:
        """The output for `data`: kept, being encoded, or encoded now by `encode` (and kept)."""
        key = hashlib.sha256(data).digest()
        if key in self._entries:
            self.hits += 1
            self._entries.move_to_end(key)
            return self._entries[key]
        if key in self._pending:
            self.hits += 1
            return await asyncio.shield(self._pending[key])
        self.misses += 1
        future: asyncio.Future[Encoded | Exception] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            result = await encode()
            future.set_result(result)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: an error no waiter reads is not logged as lost
            raise
        finally:
            del self._pending[key]
        if not isinstance(result, Exception):
            self._keep(key, result)
        return result

    def _keep(self, key: bytes, encoded: Encoded) -> None:
        size = encoded.embeddings.nbytes
        if size > self.limit:
            return
        self._entries[key] = encoded
        self.size += size
        while self.size > self.limit:
            _, dropped = self._entries.popitem(last=False)
            self.size -= dropped.embeddings.nbytes

    def __len__(self) -> int:
        return len(self._entries)


class EncoderExecutor(Executor[EncoderSettings, MediaItem, EncoderOutput]):
    """Encodes media items of one modality; concurrent calls share one encoder forward pass, and
    recent items' outputs are kept (`EncoderSettings.cache_mib`)."""

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        await asyncio.to_thread(self.adapter.load_encoder, self.task.modality)
        self.batcher: AsyncBatcher[MediaItem, Encoded | Exception] = AsyncBatcher(
            self._encode, self.task.max_batch
        )
        self.cache = EncodedCache(self.task.cache_mib << 20)

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
            if self.task.cache_mib:
                result = await self.cache.get(item.data, lambda: self.batcher.submit(item))
            else:
                result = await self.batcher.submit(item)
            if isinstance(result, Exception):
                raise result
        return EncoderOutput(embeddings=DataHandle.wrap(result.embeddings), meta=DataHandle.wrap(result.meta))
