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
from prismserve.runtime.pool import InProcessPool, in_process_refusal
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
    names (`executor_ref`). `on_graph` sees every graph before it runs.
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
            reason = self.unrunnable(node.task)
            if reason is not None:
                raise DispatchError.at(node.index, type(node.task).__name__, f"cannot run here: {reason}")
        return await super().execute(graph)

    def unrunnable(self, task: UnitTask[Any, Any]) -> str | None:
        """Why `task` cannot run here, or None: its kind has no function and its class names no
        executor that runs in this process."""
        cls = type(task)
        if cls.executor_kind in self._executors:
            return None
        if cls.executor_ref is None:
            return (
                f"{cls.__qualname__} names no executor (executor_ref) and no executor function is registered for "
                f"kind {cls.executor_kind!r} (registered: {sorted(self._executors)}), so it cannot run in this "
                "process: serve it without --in-process (the Ray runtime), or give the task an executor_ref"
            )
        return in_process_refusal(cls)

    async def deploy(self, task: UnitTask[Any, Any]) -> TaskManager:
        """Start `task`'s deployment unless it runs already (its executor loads); raises what starting raised."""
        key = task.deployment_key()
        if key in self.managers:
            return self.managers[key]
        starting = self._starting.get(key)
        if starting is None or (starting.done() and starting.exception() is not None):
            starting = self._starting[key] = asyncio.get_running_loop().create_task(self._start(task))
        return await asyncio.shield(starting)

    async def undeploy(self, key: str) -> None:
        """Stop a deployment's replica (a real executor frees its model)."""
        self._starting.pop(key, None)
        manager = self.managers.pop(key, None)
        if manager is not None:
            await manager.close()

    async def _manager(self, node: Invocation) -> TaskManager:
        try:
            return await self.deploy(node.task)
        except Exception as exc:  # noqa: BLE001 - named for the caller, tried again on the next request
            raise DispatchError.at(node.index, type(node.task).__name__, f"cannot start: {exc}") from exc

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
