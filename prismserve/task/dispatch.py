"""The dispatcher interface the task layer runs recorded graphs on, and the context that holds it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from prismserve.task.graph import TaskGraph


class Dispatcher(Protocol):
    """Executes every invocation of a recorded graph and returns their outputs in graph order.

    An output that is a stream is returned as soon as the stream exists; it fills while the
    caller iterates it.
    """

    async def execute(self, graph: TaskGraph) -> list[Any]:
        """Run the graph; outputs[i] is invocation i's output."""
        ...


current_dispatcher: ContextVar[Dispatcher | None] = ContextVar("current_dispatcher", default=None)


@contextmanager
def use_dispatcher(dispatcher: Dispatcher) -> Iterator[Dispatcher]:
    """Run `await task(...)` calls in this context on `dispatcher`."""
    token = current_dispatcher.set(dispatcher)
    try:
        yield dispatcher
    finally:
        current_dispatcher.reset(token)
