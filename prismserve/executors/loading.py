"""Building the real executor of a unit task (`UnitTask.executor_class`), on a replica or in this process."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from prismserve.errors import ReplicaStartError
from prismserve.executors.base import Executor
from prismserve.models.base import requested_device
from prismserve.task import UnitTask


def load_executor_class(task_class: type[UnitTask[Any, Any]]) -> type[Executor]:
    """The Executor class a unit task names in `executor_class`."""
    path = task_class.executor_class
    if not path:
        raise ValueError(f"{task_class.__qualname__} names no executor: only `sim` executors can run it")
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Executor)):
        raise ValueError(f"{task_class.__qualname__}.executor_class = {path!r} is not an Executor class")
    return cls


def check_device(deployment: str, gpu_ids: list[str]) -> None:
    """Refuse to start a model replica that Ray placed on GPUs (`gpu_ids`) where torch sees no CUDA
    device, unless `PRISMSERVE_DEVICE=cpu` asks for the CPU: it would run on the CPU unnoticed, at a
    fraction of the speed its plan counts on."""
    if not gpu_ids or requested_device() == "cpu":
        return
    import torch

    if torch.cuda.is_available():
        return
    build = (
        f"torch {torch.__version__} ({f'CUDA {torch.version.cuda}' if torch.version.cuda else 'a CPU build'})"
    )
    raise ReplicaStartError(
        f"a replica of {deployment} was placed on GPUs {', '.join(gpu_ids)} but {build} sees no CUDA device: "
        "install a CUDA build of torch, or serve with --fake-gpus / set PRISMSERVE_DEVICE=cpu to run on "
        "the CPU with declared GPUs"
    )


class InProcessExecutors:
    """Real executors in this process, one per deployment, loaded on first use (LocalDispatcher, tests)."""

    def __init__(self) -> None:
        self._executors: dict[str, asyncio.Task[Executor]] = {}

    async def get(self, task: UnitTask[Any, Any]) -> Executor:
        """The loaded executor of `task`'s deployment."""
        key = task.deployment_key()
        if key not in self._executors or (self._executors[key].done() and self._executors[key].exception()):
            self._executors[key] = asyncio.get_running_loop().create_task(self._load(task))
        return await asyncio.shield(self._executors[key])

    @staticmethod
    async def _load(task: UnitTask[Any, Any]) -> Executor:
        if type(task).executor_env:
            raise RuntimeError(
                f"{type(task).__name__} runs in the {type(task).executor_env} environment, not in this process: "
                "serve it on the Ray runtime"
            )
        executor = load_executor_class(type(task))(task)
        await executor.load()
        return executor

    def callables(
        self, task_classes: Iterable[type[UnitTask[Any, Any]]]
    ) -> dict[str, Callable[[UnitTask[Any, Any], Any], Any]]:
        """Executor functions by executor kind (for LocalDispatcher) running these task classes on real executors."""

        async def run(task: UnitTask[Any, Any], task_input: Any) -> Any:
            return await (await self.get(task)).run(task_input)

        async def stream(task: UnitTask[Any, Any], task_input: Any) -> AsyncIterator[Any]:
            async for item in (await self.get(task)).stream(task_input):
                yield item

        return {cls.executor_kind: stream if cls._output_fields is None else run for cls in task_classes}

    async def close(self) -> None:
        """Close every loaded executor."""
        for pending in self._executors.values():
            if pending.done() and not pending.exception():
                await pending.result().close()
        self._executors.clear()
