"""The runtime: apps' deployments, executors and the dispatcher that runs task graphs on them."""

from __future__ import annotations

from prismserve.runtime.base import LocalRuntime, Runtime
from prismserve.runtime.plan import CellSpec, DeploymentPlan


def create_runtime(*, address: str | None = None, fake_gpus: int | None = None, backend: str = "sim") -> Runtime:
    """The runtime `prismserve serve` uses.

    For now an in-process LocalRuntime on the toy executors; the Ray runtime replaces it
    (`address` joins a Ray cluster, `fake_gpus` declares GPUs on a CPU-only machine).
    """
    from prismserve.toy.executors import EXECUTORS

    return LocalRuntime(EXECUTORS)


__all__ = ["CellSpec", "DeploymentPlan", "LocalRuntime", "Runtime", "create_runtime"]
