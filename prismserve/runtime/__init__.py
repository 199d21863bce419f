"""The runtime: apps' deployments, executors and the dispatcher that runs task graphs on them."""

from __future__ import annotations

from prismserve.runtime.base import LocalRuntime, Runtime


def create_runtime(
    *, address: str | None = None, fake_gpus: int | None = None, policy: str = "static"
) -> Runtime:
    """The runtime `prismserve serve` uses: the Ray runtime.

    `address` joins a Ray cluster (default: start a local one); `fake_gpus` declares GPUs on a
    CPU-only machine. Unit tasks that name a real executor (the task library's encoders, LLMs,
    generators) run on it; other tasks run on `sim` replicas, their outputs computed by the app's
    `Config.sim_values` functions or synthesised.
    """
    from prismserve.runtime.ray_runtime import RayRuntime
    from prismserve.task.routing import ROUTING_POLICIES

    if policy not in ROUTING_POLICIES:
        raise ValueError(f"unknown routing policy {policy!r}: use one of {', '.join(ROUTING_POLICIES)}")

    return RayRuntime(address=address, fake_gpus=fake_gpus, policy=policy)


__all__ = ["LocalRuntime", "Runtime", "create_runtime"]
