"""The `sim` backend: an emulated executor whose service time follows a profile.

Whole deployments of large models can then run on CPU with fake GPUs: the runtime, data plane
and routing are real, only the model computation is replaced by waiting. Output values come from
a value function (for example the toy executors) or are synthesised from the output type.
"""

from __future__ import annotations

import asyncio
import inspect
import types
import typing
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from prismserve.executors.base import Batcher, Executor
from prismserve.task import DataHandle, Stream, UnitTask


class SimProfile(BaseModel):
    """Service-time model of one replica.

    A batch of b requests takes `latency_s * (1 + batch_growth * (b - 1))`; streams produce `items`
    items after that, one every `item_s * (1 + batch_growth * (active - 1))` with `active` streams
    decoding at once. Synthesised DataHandle payloads are `payload_bytes` long.
    """

    latency_s: float = Field(default=0.0, ge=0)
    batch_growth: float = Field(default=0.0, ge=0)
    max_batch: int = Field(default=1, ge=1)
    items: int = Field(default=8, ge=0)
    item_s: float = Field(default=0.0, ge=0)
    payload_bytes: int = Field(default=1024, ge=0)

    def batch_time(self, size: int) -> float:
        """Seconds one batch of `size` requests takes."""
        return self.latency_s * (1 + self.batch_growth * (size - 1))


ValueFunction = Callable[[UnitTask[Any, Any], Any], Any]


class SimExecutor(Executor):
    """Waits as the profile says, then returns the value function's output (or a synthesised one)."""

    def __init__(self, task: UnitTask[Any, Any], profile: SimProfile, values: ValueFunction | None = None) -> None:
        super().__init__(task)
        self.profile = profile
        self._values = values
        self._batcher: Batcher[Any, None] = Batcher(self._serve_batch, profile.max_batch)
        self._decoding = 0

    async def _serve_batch(self, inputs: list[Any]) -> list[None]:
        await _sleep(self.profile.batch_time(len(inputs)))
        return [None] * len(inputs)

    async def _service(self, task_input: Any) -> None:
        if self.profile.latency_s > 0:
            await self._batcher.submit(task_input)
        else:
            await asyncio.sleep(0)  # nothing to emulate: no batching, but yield as an engine would

    async def run(self, task_input: Any) -> Any:
        await self._service(task_input)
        if self._values is None:
            return synthesize(type(self.task).output_type, self.profile)
        result = self._values(self.task, task_input)
        return await result if inspect.isawaitable(result) else result

    async def stream(self, task_input: Any) -> AsyncIterator[Any]:
        await self._service(task_input)
        if self._values is None:
            source: AsyncIterator[Any] = _synthesized_items(type(self.task).output_type, self.profile.items)
        else:
            source = self._values(self.task, task_input)
        self._decoding += 1
        try:
            async for item in source:
                yield item
                await _sleep(self.profile.item_s * (1 + self.profile.batch_growth * (self._decoding - 1)))
        finally:
            self._decoding -= 1


async def _sleep(seconds: float) -> None:
    # Yield to the loop even for zero-latency profiles, as a real engine would.
    await asyncio.sleep(seconds if seconds > 0 else 0)


def synthesize(output_type: Any, profile: SimProfile) -> Any:
    """An output of `output_type` with placeholder values of plausible size."""
    values = {name: _synthesize_value(info.annotation, profile) for name, info in output_type.model_fields.items()}
    return output_type.model_validate(values)


def _synthesize_value(annotation: Any, profile: SimProfile) -> Any:
    origin = typing.get_origin(annotation)
    if annotation is DataHandle or origin is DataHandle:
        return np.zeros(max(1, profile.payload_bytes // 4), dtype=np.float32)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _synthesize_value(args[0], profile) if len(args) == len(typing.get_args(annotation)) else None
    if annotation is Stream or origin is Stream:
        return None
    if origin in (list, tuple, set):
        return []
    if origin is dict:
        return {}
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return synthesize(annotation, profile)
        if issubclass(annotation, bytes):
            return b"\0" * profile.payload_bytes
        for kind, value in ((bool, False), (str, ""), (int, 0), (float, 0.0)):
            if issubclass(annotation, kind):
                return value
    return None


async def _synthesized_items(stream_type: Any, count: int) -> AsyncIterator[Any]:
    (item_type,) = typing.get_args(stream_type) or (str,)
    for i in range(count):
        if item_type is bytes:
            yield bytes(8)
        elif item_type is str:
            yield f"t{i}"
        else:
            yield i
