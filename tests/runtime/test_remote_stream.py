"""`RemoteStream`: a replica's view of a stream another replica produces pulls it however it is
read (item by item, or in the lists `batches` gives a consumer that fell behind)."""

from __future__ import annotations

import asyncio

import pytest

from prismserve.runtime.streams import RemoteStream, RemoteStreamRef, StreamTable
from prismserve.task import Stream


class Producer:
    """The producing replica's side of the wire: its stream table's reads (what `read_stream` answers)."""

    def __init__(self) -> None:
        self.table = StreamTable()

    async def read_stream(self, stream_id: str, start: int):
        return await self.table.read(stream_id, start)


@pytest.mark.parametrize("reading", ["items", "batches"])
def test_a_remote_stream_pulls_what_its_producer_puts_however_it_is_read(reading):
    async def scenario() -> list[int]:
        producer, source = Producer(), Stream[int]()
        producer.table.add(source)
        source.put(1)
        remote = RemoteStream(RemoteStreamRef(producer, source.id, items=(1,)))  # type: ignore[arg-type]

        async def produce() -> None:
            for item in (2, 3, 4):
                await asyncio.sleep(0.01)
                source.put(item)
            source.close()

        async def consume() -> list[int]:
            if reading == "items":
                return [item async for item in remote]
            return [item async for items in remote.batches() for item in items]

        producing = asyncio.ensure_future(produce())
        got = await asyncio.wait_for(consume(), 10)  # a stream nobody pulls never ends
        await producing
        return got

    assert asyncio.run(scenario()) == [1, 2, 3, 4]
