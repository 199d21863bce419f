"""Building the real executor of a unit task (`UnitTask.executor_ref`), on a replica or in this process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from prismserve.errors import ReplicaStartError
from prismserve.executors.base import Executor
from prismserve.models.base import requested_device
from prismserve.task import UnitTask


def load_executor_class(task_class: type[UnitTask[Any, Any]]) -> type[Executor[Any, Any, Any]]:
    """The Executor class a unit task names in `executor_ref`, checked against the task's types."""
    ref = task_class.executor_ref
    if ref is None:
        raise ValueError(f"{task_class.__qualname__} names no executor: only `sim` executors can run it")
    cls = ref.resolve()
    if not issubclass(cls, Executor):
        raise ValueError(
            f"{task_class.__qualname__}.executor_ref names {ref.path!r}, which is not an Executor class: "
            "name a subclass of prismserve.executors.base.Executor"
        )
    mismatch = contract_mismatch(task_class, cls)
    if mismatch is not None:
        raise ValueError(f"{task_class.__qualname__}.executor_ref names {ref.path!r}, but {mismatch}")
    return cls


def contract_mismatch(
    task_class: type[UnitTask[Any, Any]], executor: type[Executor[Any, Any, Any]]
) -> str | None:
    """Why `executor` cannot run `task_class` (its settings, input or output type does not fit the
    executor's type arguments), or None when it can."""
    name = executor.__qualname__
    wants = {"settings": executor.settings_type, "input": executor.input_type}
    for what, expected in wants.items():
        if not isinstance(expected, type):
            return f"{name} leaves its {what} type open: name a subclass that sets its type arguments"
    if not issubclass(task_class, executor.settings_type):
        return f"the task is not a {executor.settings_type.__qualname__} (the settings {name} reads)"
    if not issubclass(task_class.input_type or object, executor.input_type):
        return f"{name} serves {executor.input_type.__qualname__}, not the task's input type"
    if not _fits(task_class.output_type, executor.output_type):
        return f"{name} gives {executor.output_type!r}, not the task's output type {task_class.output_type!r}"
    return None


def _fits(output: Any, given: Any) -> bool:
    """Whether an executor giving `given` gives a task's `output`: the same type (a `Stream[...]`
    included), a subclass of a TaskOutput, or Any (an executor that runs every task)."""
    if given is Any or given == output:
        return True
    return isinstance(given, type) and isinstance(output, type) and issubclass(given, output)


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


def memory_fraction(gpus: float, device: str) -> float | None:
    """The part of its GPU's memory a replica with `gpus` may take on `device`: its share when that
    is below one GPU and the device is CUDA (the replicas sharing the GPU take the rest), else None."""
    return gpus if 0 < gpus < 1 and device.startswith("cuda") else None


def model_adapter(task: Any) -> Any:
    """The family adapter of `task.model` (a transformers or diffusers task's), on the device models
    load on, in the task's dtype; on CUDA a replica with a share of a GPU is held to that share of
    the GPU's memory (torch's allocator refuses more), so the replicas sharing the GPU cannot starve
    each other."""
    from prismserve.models import adapter_for

    adapter = adapter_for(task.model, dtype=task.dtype)
    fraction = memory_fraction(task.gpus, adapter.device)
    if fraction is not None:
        import torch

        torch.cuda.set_per_process_memory_fraction(fraction, cuda_index(adapter.device))
    return adapter


def cuda_index(device: str) -> int:
    """The index of the CUDA device `device` names, a bare "cuda" being the current one: torch's
    per-device calls (`set_per_process_memory_fraction`) refuse a `torch.device("cuda")` without one."""
    import torch

    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


START_TIMEOUT_VARIABLE = "PRISMSERVE_START_TIMEOUT_S"
BASE_START_S = 120.0  # a replica's process, imports, engine start: what a tiny model needs
START_S_PER_GIB = 30.0  # reading weights to the device, measured slower than disk speed on busy nodes
DOWNLOAD_START_S = 1800.0  # a checkpoint neither on disk nor in the hub cache is downloaded first
WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf"})


def checkpoint_bytes(model: str, cache_dir: str | None = None) -> int | None:
    """Bytes of the weight files of `model`: a local directory, or a hub id already in the Hugging
    Face cache (`cache_dir`, default the hub's); None when neither (it would be downloaded)."""
    root = Path(model)
    if not root.is_dir():
        try:  # the models extra brings it; a serving process without it cannot know
            from huggingface_hub import snapshot_download
            from huggingface_hub.errors import LocalEntryNotFoundError
        except ImportError:
            return None
        try:
            root = Path(snapshot_download(model, cache_dir=cache_dir, local_files_only=True))
        except (LocalEntryNotFoundError, ValueError, OSError):  # not cached, or not a hub id at all
            return None
    # Diffusers pipelines keep their weights in a folder per component; the cache links to blobs.
    return sum(f.stat().st_size for f in root.rglob("*") if f.suffix in WEIGHT_SUFFIXES and f.is_file())


def start_timeout_s(task: UnitTask[Any, Any] | None, cache_dir: str | None = None) -> float:
    """How long a replica of `task` may take to start: `PRISMSERVE_START_TIMEOUT_S` when set, else
    120 s plus 30 s per GiB of its checkpoint's weights (`task.model`) when they are on disk, else
    1800 s for a download. `None` (a sim replica) or a task without a checkpoint gets the 120 s."""
    configured = os.environ.get(START_TIMEOUT_VARIABLE, "").strip()
    if configured:
        try:
            seconds = float(configured)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(f"{START_TIMEOUT_VARIABLE}={configured!r} is not a number of seconds above 0")
        return seconds
    model = getattr(task, "model", None)
    if not isinstance(model, str):
        return BASE_START_S
    size = checkpoint_bytes(model, cache_dir)
    if size is None:
        return DOWNLOAD_START_S
    return BASE_START_S + START_S_PER_GIB * size / 2**30


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
        ref = type(task).executor_ref
        if ref is not None and ref.env:
            raise RuntimeError(
                f"{type(task).__name__} runs in the {ref.env} environment, not in this process: "
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
