"""The executor protocol: one interface for every engine that runs a unit task on a replica."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import math
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, ClassVar, Generic, TypeVar

from prismserve.errors import ExecutorUnhealthy as ExecutorUnhealthy  # its users import it from here
from prismserve.models.base import MediaError
from prismserve.task import ExecutorSettings, InvalidInputError, TaskInput
from prismserve.task.context import current_request

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
SettingsT = TypeVar("SettingsT", bound=ExecutorSettings)
InputT = TypeVar("InputT", bound=TaskInput)
OutputT = TypeVar("OutputT")

_arrivals = itertools.count()


def queue_key(priority: float = 0.0, service_s: float = 0.0) -> tuple[float, float, int]:
    """Where a call waits in an executor's queue (the smallest key is served first): by slack, its
    request's deadline less the `service_s` it needs here (calls without a deadline after those with
    one), then by `priority` (higher first), then in arrival order. The deadline is the request
    context's, set by the replica around each invocation."""
    deadline = current_request().deadline
    slack = deadline - service_s if deadline is not None else math.inf
    return (slack, -priority, next(_arrivals))


def deadline_priority() -> int:
    """An engine's priority (smaller first) for the call being served: its request's deadline in
    milliseconds (earliest deadline first), calls without one after every call with one. What vLLM's
    `priority` scheduling policy orders by (`engine_args={"scheduling_policy": "priority"}`)."""
    deadline = current_request().deadline
    return round(deadline * 1000) if deadline is not None else 2**62


@contextlib.contextmanager
def media_rejected() -> Iterator[None]:
    """A model's MediaError (media it cannot take) re-raised as the task layer's InvalidInputError:
    the request's fault, answered with a 4xx, not a failed executor."""
    try:
        yield
    except MediaError as exc:
        raise InvalidInputError(str(exc)) from exc


def call_soon(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    """`callback(*args)` on `loop` from another thread, unless the loop has closed meanwhile."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


class Executor(Generic[SettingsT, InputT, OutputT]):
    """Runs one unit task's invocations inside a replica.

    Generic over the settings it reads from its task (`self.task`), the input type it serves and
    the output type it gives (`Executor[EncoderSettings, MediaItem, EncoderOutput]`, from
    `prismserve.task.components`): the contract a unit task's `executor_ref` is checked against.
    `run` serves tasks whose output is a TaskOutput, `stream` those whose output is a Stream.
    Inputs arrive with every data handle already fetched; outputs may hold raw values in
    DataHandle fields (the replica moves them to the data plane). Engines that batch (vLLM's
    async engine, a transformers encoder, a diffusers pipeline) batch concurrent calls themselves,
    or with `AsyncBatcher`.
    """

    # The type arguments, readable on the class: a unit task's settings, input and output types
    # must fit them (TypeVars while a generic subclass leaves them open, None on Executor itself).
    settings_type: ClassVar[Any] = None
    input_type: ClassVar[Any] = None
    output_type: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Executor):
                cls.settings_type, cls.input_type, cls.output_type = _type_arguments(origin, base)

    def __init__(self, task: SettingsT) -> None:
        self.task = task
        # Background work by the request it serves (the loop keeps only weak references to tasks).
        self._background: dict[str, set[asyncio.Task[Any]]] = {}

    def spawn(self, work: Awaitable[Any]) -> None:
        """Run `work` in the background: what fills the streams an output returned already holds.
        It belongs to the request being served, and stops when that request is released (`cancel`)."""
        request = current_request().id
        running = asyncio.ensure_future(work)
        self._background.setdefault(request, set()).add(running)
        running.add_done_callback(lambda done: self._forget(request, done))

    def _forget(self, request: str, done: asyncio.Task[Any]) -> None:
        tasks = self._background.get(request)
        if tasks is not None:
            tasks.discard(done)
            if not tasks:
                del self._background[request]

    def cancel(self, request: str) -> None:
        """Stop the background work of `request`, released: nobody can read the streams it fills (a
        barge-in, a client gone), so a thinker stops generating instead of answering to its limit."""
        for running in list(self._background.get(request, ())):
            running.cancel()

    async def load(self) -> None:
        """Load weights / start the engine; called once before the first invocation."""

    async def health(self) -> None:
        """Raise ExecutorUnhealthy when the executor can no longer serve."""

    async def run(self, task_input: Any) -> Any:
        """The output of one invocation (a TaskOutput instance or a dict of its fields)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not serve {type(self.task).__name__} (not streaming)"
        )

    def stream(self, task_input: Any) -> AsyncIterator[Any]:
        """The items of one streaming invocation."""
        raise NotImplementedError(f"{type(self).__name__} does not stream {type(self.task).__name__}")

    async def close(self) -> None:
        """Release the engine's resources."""


def _type_arguments(origin: type[Executor[Any, Any, Any]], base: Any) -> tuple[Any, Any, Any]:
    """Executor's (settings, input, output) type arguments that the parametrised `base` (an
    `origin[...]`) gives: its arguments put in for the type variables `origin` left open."""
    parameters = getattr(origin, "__parameters__", ())
    bound = dict(zip(parameters, typing.get_args(base), strict=True))
    declared = (
        parameters if origin is Executor else (origin.settings_type, origin.input_type, origin.output_type)
    )
    settings, task_input, output = (bound.get(t, t) if isinstance(t, TypeVar) else t for t in declared)
    return settings, task_input, output


class AsyncBatcher(Generic[ItemT, ResultT]):
    """Groups concurrent calls (coroutines) into batches of at most `max_batch`, one batch at a time;
    `models.base.ThreadBatcher` is the same for callers that are threads.

    `handler(items)` returns one result per item, in order. Calls wait by `queue_key`: the least
    slack to their request's deadline first (`service(item)`: the seconds an item needs, 0 when
    not given), then by `priority` (item -> number, higher first), then in arrival order.
    """

    def __init__(
        self,
        handler: Callable[[list[ItemT]], Awaitable[list[ResultT]]],
        max_batch: int,
        priority: Callable[[ItemT], float] | None = None,
        service: Callable[[ItemT], float] | None = None,
    ) -> None:
        self._handler = handler
        self._max_batch = max(1, max_batch)
        self._priority = priority
        self._service = service
        self._queue: list[tuple[tuple[float, float, int], ItemT, asyncio.Future[ResultT]]] = []
        self._worker: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Calls waiting for a batch."""
        return len(self._queue)

    async def submit(self, item: ItemT) -> ResultT:
        """The result for `item`, computed in some batch."""
        future: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        key = queue_key(
            self._priority(item) if self._priority else 0.0, self._service(item) if self._service else 0.0
        )
        bisect.insort(self._queue, (key, item, future), key=lambda entry: entry[0])
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            try:
                results = await self._handler([item for _, item, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every caller of the batch gets the error
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, _, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
