"""Shared test set-up: telemetry off (importing prismserve does it), hub offline mode unless the run
chose otherwise, each test marked by the tier it belongs to (`tiers`), the run's one Ray cluster, a
gateway server in a thread."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from ray_session import GPUS_PER_NODE
from tiers import mark_tiers, uses

import prismserve  # noqa: F401  (telemetry off before Ray starts)
from prismserve.offline import HUB_OFFLINE

# Tests build their checkpoints locally and must not reach the hub (a run may still choose
# HF_HUB_OFFLINE=0). Set before anything imports the Hugging Face libraries or starts Ray.
for _name, _value in HUB_OFFLINE.items():
    os.environ.setdefault(_name, _value)


def _find_workloads() -> None:
    # The shared workloads sit beside the checkout (../shared/workloads); a checkout made somewhere
    # else on these machines still finds them where the project keeps them.
    from pathlib import Path

    from prismserve.bench.workloads import WorkloadError, workloads_dir

    try:
        workloads_dir()
    except WorkloadError:
        if Path("/work/shared/workloads/README.md").exists():
            os.environ.setdefault("PRISMSERVE_WORKLOADS", "/work/shared/workloads")


_find_workloads()


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tiers(items)


@pytest.fixture(scope="session")
@uses("ray")
def ray_cluster():
    """One Ray session for the whole run: a simulated two-node cluster with `GPUS_PER_NODE` declared
    GPUs per node, named `head` and `worker` for plans that pin cells, on which model replicas run
    on the CPU (`PRISMSERVE_DEVICE=cpu`, as `--fake-gpus` sets it). The tests' runtimes join it, and
    so do their `prismserve serve --address` subprocesses."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    from prismserve.runtime.pool import NODE_RESOURCE

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "num_gpus": GPUS_PER_NODE,
            "include_dashboard": False,
            "resources": {f"{NODE_RESOURCE}head": 1},  # names a plan's cells may be pinned to
        },
    )
    cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE, resources={f"{NODE_RESOURCE}worker": 1})
    cluster.wait_for_nodes()
    ray.init(
        address=cluster.address,
        include_dashboard=False,
        logging_level="WARNING",
        runtime_env={"env_vars": {"PRISMSERVE_DEVICE": "cpu"}},
    )
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(autouse=True)
def released_gpus(request):
    """Each test on the cluster starts with every GPU free that no live placement group holds: Ray
    gives a removed group's GPUs back only once its actors are dead, which on a loaded machine can
    outlast a placement timeout of the next test's runtime."""
    if "ray_cluster" in request.fixturenames:
        request.getfixturevalue("ray_cluster")
        _wait_for_released_gpus(timeout_s=120)
    yield


def _wait_for_released_gpus(timeout_s: float) -> None:
    import ray
    from ray.util.placement_group import placement_group_table

    deadline = time.monotonic() + timeout_s
    while True:
        held = sum(
            bundle.get("GPU", 0.0)
            for group in placement_group_table().values()
            if group["state"] != "REMOVED"
            for bundle in group["bundles"].values()
        )
        free = ray.available_resources().get("GPU", 0.0)
        if free + held >= ray.cluster_resources().get("GPU", 0.0):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the cluster's GPUs were not released within {timeout_s:.0f} s ({free:g} free)")
        time.sleep(0.1)


@contextlib.contextmanager
def _serve(app) -> Iterator[str]:
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        if thread.is_alive():  # its runtime would still hold the cluster's GPUs: later tests would fail
            raise RuntimeError("the gateway did not stop within 60 s")


@pytest.fixture(scope="session")
def serve_gateway():
    """Start a FastAPI app on a free 127.0.0.1 port in a thread: `with serve_gateway(app) as url:`."""
    return _serve


@pytest.fixture(scope="session")
def span_exporter():
    """An in-memory span exporter installed as the process's tracer provider (once per run)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from prismserve.observability import setup_tracing

    exporter = InMemorySpanExporter()
    setup_tracing("prismserve-tests", exporter=exporter)
    return exporter
