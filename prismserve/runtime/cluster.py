"""Connecting to Ray: a local Ray started on demand (the embedded default), or an existing cluster."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any

from prismserve.offline import DEVICE_VARIABLE, disable_telemetry, replica_env

log = logging.getLogger(__name__)


def connect(address: str | None = None, *, fake_gpus: int | None = None, num_cpus: int | None = None) -> bool:
    """Make sure this process is connected to Ray; returns True if this call started or joined it.

    Without `address` a local Ray starts, bound to 127.0.0.1; `fake_gpus` declares that many GPUs
    on a CPU-only machine so that planning, placement and routing run for real, and has model
    replicas run on the CPU (`PRISMSERVE_DEVICE=cpu`) on the GPUs Ray gives them.
    """
    disable_telemetry()
    import ray

    if ray.is_initialized():
        return False
    env = replica_env()  # replicas download (or not) as this process does
    if fake_gpus is not None:  # declared GPUs: model replicas run on the CPU, as asked
        env[DEVICE_VARIABLE] = "cpu"
    if "OTEL_EXPORTER_OTLP_ENDPOINT" in os.environ:  # replicas export their spans there too
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    options: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "runtime_env": {"env_vars": env},
    }
    if address:
        if fake_gpus is not None:
            raise ValueError(
                "--fake-gpus applies to a local Ray only; declare GPUs when starting the cluster's nodes"
            )
        ray.init(address=address, **options)
    else:
        # "local" starts a new Ray even when another one runs on this machine (or RAY_ADDRESS is set).
        ray.init(
            address="local", num_gpus=fake_gpus, num_cpus=num_cpus, _node_ip_address="127.0.0.1", **options
        )
    return True


def local_ray_down() -> bool:
    """Whether the local Ray this process started has lost a process of its own (its GCS or raylet:
    Ctrl-C or SIGTERM to the whole process group reaches them too). Its calls would then wait for
    it in vain; a Ray this process joined is never judged so (its processes are not ours to watch)."""
    from ray._private import worker

    node = worker._global_node
    return node is not None and bool(node.all_processes) and bool(node.dead_processes())


def exit_past_a_lost_ray(code: int) -> None:
    """End this process now with `code` where the local Ray it started has lost its GCS or raylet
    (Ctrl-C or SIGTERM to the process group, or a crash): Ray's exit hook would wait for the dead GCS
    (seconds, or a minute and then status 1: "Failed to connect to GCS within 60 seconds"). Every
    process this one started and is still alive is killed first: Ray's, and their children (the
    raylet's agents outlive a raylet killed with the GCS gone). Nothing happens while Ray is up."""
    if not local_ray_down():
        return
    import psutil

    started = psutil.Process().children(recursive=True)
    for process in started:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(started, timeout=10)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
