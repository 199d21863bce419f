"""Shared test set-up: telemetry off (importing prismserve does it), hub offline mode unless the run
chose otherwise, a gateway server in a thread."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import prismserve  # noqa: F401
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
