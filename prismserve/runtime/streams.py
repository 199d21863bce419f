"""Streams across processes: the producing replica keeps the items, readers pull them in batches."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from prismserve.errors import StreamReadError
from prismserve.runtime.wire import ReplicaAddress
from prismserve.task import DispatchError, Stream


def _portable(error: BaseException) -> DispatchError:
    """What a stream's readers get of its failure: a DispatchError already names the call and component
    (as attributes, which the gateway reports); other errors keep their type in the message."""
    return error if isinstance(error, DispatchError) else DispatchError(f"{type(error).__name__}: {error}")


@dataclass(frozen=True, slots=True)
class RemoteStreamRef:
    """Names a stream held by a replica: what a streaming invocation returns through Ray.

    It carries the items the stream had when the invocation returned (at least the first), so a
    fast producer's whole stream often arrives with no further round trip.
    """

    owner: ReplicaAddress  # the replica holding the stream
    stream_id: str
    items: tuple[Any, ...] = ()
    closed: bool = False
    error: DispatchError | None = None


class RemoteStream(Stream[Any]):
    """A local view of a replica's stream, filled by pulling from the replica once iterated."""

    __slots__ = ("_ref", "_pump")

    def __init__(self, ref: RemoteStreamRef) -> None:
        super().__init__(ref.stream_id)
        self._ref = ref
        self._pump: asyncio.Task[None] | None = None
        for item in ref.items:
            self.put(item)
        if ref.closed:
            self.fail(StreamReadError.of(ref.error)) if ref.error is not None else self.close()

    def _reading(self) -> None:
        if self._pump is None and not self._ref.closed:
            self._pump = asyncio.get_running_loop().create_task(self._pull())

    async def _pull(self) -> None:
        start = len(self._ref.items)
        try:
            while True:
                items, closed, error = await self._ref.owner.read_stream(self._ref.stream_id, start)
                for item in items:
                    self.put(item)
                start += len(items)
                if closed:
                    if error is not None:
                        self.fail(StreamReadError.of(error))
                    else:
                        self.close()
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the producer's replica died or is unreachable
            self.fail(StreamReadError(f"stream {self.id} was lost: {exc}"))


class StreamTable:
    """The streams a replica produces, readable by id until released."""

    def __init__(self) -> None:
        self._streams: dict[str, Stream[Any]] = {}

    def add(self, stream: Stream[Any]) -> None:
        """Make a stream readable."""
        self._streams[stream.id] = stream

    async def read(self, stream_id: str, start: int) -> tuple[list[Any], bool, DispatchError | None]:
        """Items from `start` on, waiting for at least one unless the stream has ended."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return (
                [],
                True,
                DispatchError(f"stream {stream_id} is not held by this replica (released or never created)"),
            )
        await stream.wait_beyond(start)
        items, closed, error = stream.snapshot(start)
        return items, closed, None if error is None else _portable(error)

    async def first_batch(self, stream: Stream[Any], owner: ReplicaAddress) -> RemoteStreamRef:
        """A reference to `stream` once it has its first item (or has ended), carrying what it has.

        While items keep arriving on every turn of the event loop (a fast producer), it keeps
        collecting, so that such a stream travels whole with the invocation's result.
        """
        await stream.wait_beyond(0)
        seen = -1
        items, closed, error = stream.snapshot(0)
        while not closed and len(items) != seen:
            seen = len(items)
            await asyncio.sleep(0)
            items, closed, error = stream.snapshot(0)
        return RemoteStreamRef(
            owner, stream.id, tuple(items), closed, None if error is None else _portable(error)
        )

    def release_prefix(self, prefix: str) -> None:
        """Forget the streams whose ids start with `prefix` (their request has ended)."""
        for stream_id in [s for s in self._streams if s.startswith(prefix)]:
            del self._streams[stream_id]

    def __len__(self) -> int:
        return len(self._streams)
