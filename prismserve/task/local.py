"""LocalDispatcher: executes a TaskGraph in-process against Python callables, one per executor kind."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from prismserve.task.base import UnitTask
from prismserve.task.data import Stream
from prismserve.task.errors import DispatchError, InvalidInputError
from prismserve.task.graph import Invocation, TaskGraph, data_id

# An executor gets the unit task (its configuration) and the resolved input. It returns the output
# (or a dict of its fields); an `async def` may be awaited; an async generator feeds a Stream output.
# Plain functions run in a worker thread so that they do not stall the event loop.
LocalExecutor = Callable[[UnitTask[Any, Any], Any], Any]


async def naming_errors(source: AsyncIterator[Any], index: int, task_name: str) -> AsyncIterator[Any]:
    """`source`'s items; an error it raises becomes a DispatchError naming the call and its task
    (an InvalidInputError stays one: the request's fault)."""
    try:
        async for item in source:
            yield item
    except (DispatchError, InvalidInputError):
        raise
    except Exception as exc:  # noqa: BLE001 - every consumer of the stream gets the named error
        raise DispatchError(f"call #{index} ({task_name}) failed: {type(exc).__name__}: {exc}") from exc


class LocalDispatcher:
    """Runs every invocation of a graph concurrently; each waits only for the outputs it consumes."""

    def __init__(
        self,
        executors: Mapping[str, LocalExecutor],
        *,
        on_graph: Callable[[TaskGraph], None] | None = None,
    ) -> None:
        self._executors = dict(executors)
        self._on_graph = on_graph
        self._background: set[asyncio.Task[Any]] = set()

    async def execute(self, graph: TaskGraph) -> list[Any]:
        """Run the graph; outputs[i] is invocation i's output (a stream as soon as it exists)."""
        if self._on_graph is not None:
            self._on_graph(graph)
        nodes = graph.nodes
        if not nodes:
            return []
        for node in nodes:
            if node.executor_kind not in self._executors:
                raise DispatchError(
                    f"no executor registered for kind {node.executor_kind!r} (needed by call #{node.index}, "
                    f"{type(node.task).__qualname__}); registered: {sorted(self._executors)}"
                )
        loop = asyncio.get_running_loop()
        done: list[asyncio.Future[Any]] = [loop.create_future() for _ in nodes]
        runs = [loop.create_task(self._run(node, done)) for node in nodes]
        try:
            return list(await asyncio.gather(*done))
        finally:
            for run in runs:
                if not run.done():
                    run.cancel()

    async def _run(self, node: Invocation, done: list[asyncio.Future[Any]]) -> None:
        future = done[node.index]
        try:
            for producer in node.producers:
                await asyncio.shield(done[producer])
            outputs: list[Any] = [None] * len(done)
            for producer in node.producers:
                outputs[producer] = done[producer].result()
            task_input = node.resolve_input(outputs)
            future.set_result(await self._call(node, task_input))
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - reported through the node's future
            if not future.done():
                error = DispatchError(f"call #{node.index} ({type(node.task).__qualname__}) failed: {exc}")
                error.__cause__ = exc
                future.set_exception(error)

    async def _call(self, node: Invocation, task_input: Any) -> Any:
        task = node.task
        executor = self._executors[node.executor_kind]
        output_type = type(task).output_type
        if inspect.isasyncgenfunction(executor):
            if type(task)._output_fields is not None:
                raise TypeError(f"executor for {node.executor_kind!r} streams, but the task's output is not a Stream")
            stream: Stream[Any] = Stream(data_id(node.index))
            source = naming_errors(executor(task, task_input), node.index, type(task).__qualname__)
            pump = asyncio.get_running_loop().create_task(stream.drain(source))
            self._background.add(pump)  # the loop keeps only weak references to tasks
            pump.add_done_callback(self._background.discard)
            return stream
        if inspect.iscoroutinefunction(executor):
            result = await executor(task, task_input)
        else:
            result = await asyncio.to_thread(executor, task, task_input)
        if isinstance(result, Awaitable):
            result = await result
        if type(task)._output_fields is None:
            if isinstance(result, Stream):
                return result
            raise TypeError(f"executor for {node.executor_kind!r} must stream (async generator) or return a Stream")
        return result if isinstance(result, output_type) else output_type.model_validate(result)
