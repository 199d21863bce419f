"""`Stream.batches`: a consumer slower than its producer takes what piled up in one list."""

from __future__ import annotations

import asyncio

import pytest

from prismserve.task import Stream
from prismserve.task.errors import RecordError


def test_items_that_arrive_while_the_consumer_is_busy_come_in_one_list():
    async def scenario() -> list[list[int]]:
        stream: Stream[int] = Stream()
        lists: list[list[int]] = []

        async def consume() -> None:
            async for items in stream.batches():
                lists.append(items)
                await asyncio.sleep(0.05)  # busy: the producer gets ahead

        consumer = asyncio.ensure_future(consume())
        stream.put(1)
        await asyncio.sleep(0.01)  # the consumer takes [1] and is busy
        for item in (2, 3, 4):
            stream.put(item)
        await asyncio.sleep(0.1)
        stream.put(5)
        stream.close()
        await consumer
        return lists

    assert asyncio.run(scenario()) == [[1], [2, 3, 4], [5]]


def test_a_failed_stream_hands_out_its_items_then_raises():
    async def scenario() -> list[list[int]]:
        stream: Stream[int] = Stream()
        stream.put(1)
        stream.put(2)
        stream.fail(ValueError("the talker failed"))
        return [items async for items in stream.batches()]

    with pytest.raises(ValueError, match="the talker failed"):
        asyncio.run(scenario())

    async def seen() -> list[list[int]]:
        stream: Stream[int] = Stream()
        stream.put(1)
        stream.fail(ValueError("x"))
        got = []
        with pytest.raises(ValueError):
            async for items in stream.batches():
                got.append(items)
        return got

    assert asyncio.run(seen()) == [[1]]


def test_a_placeholder_cannot_be_consumed():
    with pytest.raises(RecordError):
        Stream(placeholder=True).batches()
