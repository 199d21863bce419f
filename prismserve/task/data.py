"""Data that flows between unit tasks: data handles (placeholders during record) and streams."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterable, AsyncIterator
from contextvars import ContextVar
from typing import Any, Generic, NoReturn, Protocol, TypeVar

from pydantic_core import core_schema

from prismserve.task.errors import RecordError

# Values that never hold a placeholder and compare by value: the record and replay walks skip them
# by exact type, without a call.
PLAIN_TYPES = frozenset({str, bytes, int, float, bool, type(None)})

T = TypeVar("T")

_MISSING: Any = object()
_fresh_ids = itertools.count()

# True while task data may hold placeholders in place of values (recording, loading a graph):
# TaskInput/TaskOutput then skip field validation for data that contains placeholders.
accepting_placeholders: ContextVar[bool] = ContextVar("accepting_placeholders", default=False)


def _placeholder_error(kind: str, data_id: str, use: str = "used") -> NoReturn:
    raise RecordError(
        f"the value of {kind} {data_id!r} was {use} while recording, but it does not exist yet: during "
        "record, unit-task outputs are placeholders that can only be passed on to other tasks or returned. "
        "Decide on request fields or with replayable_choice(), or branch, format or compute on model "
        "outputs in the app's serve() instead, where real values are available."
    )


class DataRef(Protocol):
    """Where a payload that lives elsewhere (another process, shared memory) can be fetched from."""

    def fetch(self) -> Any:
        """The payload (blocking)."""
        ...

    async def fetch_async(self) -> Any:
        """The payload."""
        ...


class DataHandle(Generic[T]):
    """A payload passed between tasks: a placeholder with an id during record, the real value in replay.

    Declare a field as `DataHandle[T]` when its value (a tensor, an embedding) should travel from
    producer to consumer without being materialised in the composite task. A raw value assigned to
    such a field is wrapped in a resolved handle. In a distributed runtime a handle may instead carry
    a `DataRef` and fetch the value on first use.
    """

    __slots__ = ("id", "_value", "_ref")

    def __init__(self, id: str, value: Any = _MISSING, ref: DataRef | None = None) -> None:
        self.id = id
        self._value = value
        self._ref = ref

    @classmethod
    def wrap(cls, value: Any) -> DataHandle[Any]:
        """A resolved handle holding `value`, with a fresh id."""
        return cls(f"v{next(_fresh_ids)}", value)

    def __reduce__(self) -> tuple[Any, ...]:
        # The "no value" sentinel is per process: send its absence, not a copy of it.
        if self._value is _MISSING:
            return (_unresolved_handle, (self.id, self._ref))
        return (DataHandle, (self.id, self._value, self._ref))

    @property
    def is_placeholder(self) -> bool:
        """True while the handle has neither a value nor a place to fetch it from (during record)."""
        return self._value is _MISSING and self._ref is None

    @property
    def is_local(self) -> bool:
        """True when the value is in this process."""
        return self._value is not _MISSING

    @property
    def ref(self) -> DataRef | None:
        """Where the value can be fetched from, if it lives elsewhere."""
        return self._ref

    @property
    def value(self) -> T:
        """The payload, fetched on first use if it lives elsewhere; reading it during record is an error."""
        if self._value is _MISSING:
            if self._ref is None:
                _placeholder_error("data", self.id)
            self._value = self._ref.fetch()
        return self._value

    async def fetch(self) -> T:
        """The payload, fetched without blocking the event loop if it lives elsewhere."""
        if self._value is _MISSING and self._ref is not None:
            self._value = await self._ref.fetch_async()
        return self.value

    def __repr__(self) -> str:
        if self._value is not _MISSING:
            state = type(self._value).__name__
        else:
            state = "placeholder" if self._ref is None else "remote"
        return f"DataHandle({self.id!r}, {state})"

    # A placeholder must not leak into control flow, comparisons, sets or strings: the recorded graph
    # would silently differ from what replay computes. The framework keys handles by `.id` instead.
    def __eq__(self, other: object) -> bool:
        self._refuse_placeholder(other, "compared")
        if not isinstance(other, DataHandle):
            return NotImplemented
        return self.id == other.id  # two resolved handles with one id name the same payload

    def __hash__(self) -> int:
        self._refuse_placeholder(None, "hashed (put in a set or used as a dict key)")
        return hash(self.id)

    def __lt__(self, other: object) -> bool:
        self._refuse_placeholder(other, "compared")
        return NotImplemented

    __le__ = __gt__ = __ge__ = __lt__

    def _refuse_placeholder(self, other: object, use: str) -> None:
        if self.is_placeholder:
            _placeholder_error("data", self.id, use)
        if isinstance(other, DataHandle) and other.is_placeholder:
            _placeholder_error("data", other.id, use)

    def __contains__(self, item: object) -> bool:
        self._refuse_placeholder(None, "searched with `in`")
        return item in self._held

    def __bool__(self) -> bool:
        return bool(self.value)

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __iter__(self) -> Any:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def __getitem__(self, key: Any) -> Any:
        return self._held[key]

    @property
    def _held(self) -> Any:
        """The value, for the container protocols it may or may not support (T is anything)."""
        return self.value

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda h: {"id": h.id}),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}

    @classmethod
    def _validate(cls, value: Any) -> DataHandle[Any]:
        if isinstance(value, DataHandle):
            return value
        if isinstance(value, dict) and value.keys() == {"id"}:
            return cls(str(value["id"]))
        return cls.wrap(value)


def _unresolved_handle(data_id: str, ref: DataRef | None) -> DataHandle[Any]:
    return DataHandle(data_id, ref=ref)


class Stream(Generic[T]):
    """An asynchronous stream of items (tokens, audio chunks) produced by a task.

    Any number of consumers may iterate it; each sees every item from the start, so one LLM token
    stream can feed a talker and the client at once. During record it is a placeholder.
    """

    __slots__ = ("id", "_items", "_closed", "_error", "_waiters", "_placeholder")

    def __init__(self, id: str | None = None, *, placeholder: bool = False) -> None:
        self.id = id if id is not None else f"s{next(_fresh_ids)}"
        self._items: list[T] = []
        self._closed = False
        self._error: BaseException | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._placeholder = placeholder

    @property
    def is_placeholder(self) -> bool:
        """True for the stand-in a unit task returns during record."""
        return self._placeholder

    async def drain(self, source: AsyncIterable[T]) -> None:
        """Put every item of `source`, then close; an error in `source` ends the stream with it."""
        try:
            async for item in source:
                self.put(item)
        except asyncio.CancelledError:
            self.fail(RuntimeError(f"stream {self.id!r} was cancelled"))
            raise
        except BaseException as exc:  # noqa: BLE001 - the consumer gets the producer's error
            self.fail(exc)
        else:
            self.close()

    def put(self, item: T) -> None:
        """Append an item and wake the consumers."""
        if self._closed:
            raise RuntimeError(f"stream {self.id!r} is closed")
        self._items.append(item)
        self._wake()

    def close(self) -> None:
        """End the stream normally."""
        self._closed = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        """End the stream with an error that every consumer will raise."""
        self._error = error
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def snapshot(self, start: int) -> tuple[list[T], bool, BaseException | None]:
        """Items from `start` on, whether the stream has ended, and its error if it failed."""
        return self._items[start:], self._closed, self._error

    async def wait_beyond(self, count: int) -> None:
        """Return once the stream has more than `count` items or has ended."""
        while len(self._items) <= count and not self._closed:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def __aiter__(self) -> AsyncIterator[T]:
        if self._placeholder:
            _placeholder_error("stream", self.id)
        self._reading()
        return self._iterate()

    def _reading(self) -> None:
        """A consumer starts reading (`__aiter__`, `batches`): a stream filled from elsewhere starts
        filling now."""

    async def _iterate(self) -> AsyncIterator[T]:
        index = 0
        while True:
            if index < len(self._items):
                yield self._items[index]
                index += 1
            elif self._closed:
                if self._error is not None:
                    raise self._error
                return
            else:
                await self.wait_beyond(index)

    async def collect(self) -> list[T]:
        """All items, once the stream has ended."""
        return [item async for item in self]

    def batches(self) -> AsyncIterator[list[T]]:
        """Every item, in lists of those that arrived since the last list: a consumer slower than
        its producer takes what piled up in one go (a vocoder decodes it in one window)."""
        if self._placeholder:
            _placeholder_error("stream", self.id)
        self._reading()
        return self._batches()

    async def _batches(self) -> AsyncIterator[list[T]]:
        index = 0
        while True:
            await self.wait_beyond(index)
            items, closed, error = self.snapshot(index)
            if items:
                index += len(items)
                yield items
            elif closed:
                if error is not None:
                    raise error
                return

    def __bool__(self) -> bool:
        if self._placeholder:
            _placeholder_error("stream", self.id)
        return True

    # Streams are equal only to themselves; a placeholder cannot be compared or hashed (see DataHandle).
    def __eq__(self, other: object) -> bool:
        self._refuse_placeholder(other, "compared")
        return self is other

    def __hash__(self) -> int:
        self._refuse_placeholder(None, "hashed (put in a set or used as a dict key)")
        return id(self)

    def __lt__(self, other: object) -> bool:
        self._refuse_placeholder(other, "compared")
        return NotImplemented

    __le__ = __gt__ = __ge__ = __lt__

    def __contains__(self, item: object) -> bool:
        self._refuse_placeholder(None, "searched with `in`")
        raise TypeError(f"stream {self.id!r} cannot be searched with `in`: `await stream.collect()` it first")

    def _refuse_placeholder(self, other: object, use: str) -> None:
        if self._placeholder:
            _placeholder_error("stream", self.id, use)
        if isinstance(other, Stream) and other._placeholder:
            _placeholder_error("stream", other.id, use)

    def __repr__(self) -> str:
        state = "placeholder" if self._placeholder else f"{len(self._items)} items"
        return f"Stream({self.id!r}, {state}{', closed' if self._closed else ''})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.is_instance_schema(
            cls, serialization=core_schema.plain_serializer_function_ser_schema(lambda s: {"stream": s.id})
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {"type": "object", "properties": {"stream": {"type": "string"}}}
