"""LocalDispatcher: the replica dispatcher over in-process replicas, one per deployment, started on first use.

Tests, `demo --in-process` and the in-process runtime run task graphs here exactly as the Ray runtime
does (leases, retries, stream handling, error naming), on the in-process replica pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from prismserve.executors.spec import ExecutorSpec
from prismserve.runtime.dispatcher import ReplicaDispatcher
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.task_manager import Placement, TaskManager
from prismserve.task import DispatchError, TaskGraph, UnitTask
from prismserve.task.graph import Invocation

# An executor function gets the unit task (its configuration) and the resolved input. It returns the
# output (or a dict of its fields); an `async def` is awaited; an async generator feeds a Stream
# output. Plain functions run in a worker thread so that they do not stall the event loop.
LocalExecutor = Callable[[UnitTask[Any, Any], Any], Any]


class LocalDispatcher(ReplicaDispatcher):
    """Runs every invocation of a graph in this process; each waits only for the outputs it consumes.

    A unit task runs `executors[task.executor_kind]` when given, else the real executor its class
    names (`executor_class`). `on_graph` sees every graph before it runs.
    """

    def __init__(
        self,
        executors: Mapping[str, LocalExecutor] | None = None,
        *,
        on_graph: Callable[[TaskGraph], None] | None = None,
    ) -> None:
        super().__init__({})
        self._executors = dict(executors or {})
        self._on_graph = on_graph
        self._starting: dict[str, asyncio.Task[TaskManager]] = {}

    async def execute(self, graph: TaskGraph) -> list[Any]:
        """Run the graph; outputs[i] is invocation i's output (a stream as soon as it exists)."""
        if self._on_graph is not None:
            self._on_graph(graph)
        for node in graph.nodes:
            if node.executor_kind not in self._executors and not type(node.task).executor_class:
                raise DispatchError(
                    f"no executor registered for kind {node.executor_kind!r} (needed by call #{node.index}, "
                    f"{type(node.task).__qualname__}); registered: {sorted(self._executors)}"
                )
        return await super().execute(graph)

    async def _manager(self, node: Invocation) -> TaskManager:
        key = node.task_key
        if key in self.managers:
            return self.managers[key]
        starting = self._starting.get(key)
        if starting is None or (starting.done() and starting.exception() is not None):
            starting = self._starting[key] = asyncio.get_running_loop().create_task(self._start(node.task))
        try:
            return await asyncio.shield(starting)
        except Exception as exc:  # noqa: BLE001 - named for the caller, tried again on the next request
            raise DispatchError(f"call #{node.index} ({type(node.task).__name__}) cannot start: {exc}") from exc

    async def _start(self, task: UnitTask[Any, Any]) -> TaskManager:
        function = self._executors.get(type(task).executor_kind)
        spec = ExecutorSpec(values=function) if function is not None else ExecutorSpec(backend="model")
        manager = TaskManager(task.deployment_key(), task, spec, 0, pool=InProcessPool())
        await manager.add_replica(Placement(None, 0, 0))
        self.managers[manager.key] = manager
        return manager

    async def close(self) -> None:
        """Stop every replica (real executors free their models)."""
        for manager in list(self.managers.values()):
            await manager.close()
        self.managers.clear()
        self._starting.clear()
