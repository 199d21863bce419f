"""One Ray session for the whole run: a simulated two-node cluster with 4 declared GPUs per node, on
which model replicas run on the CPU (`PRISMSERVE_DEVICE=cpu`, as `--fake-gpus` sets it)."""

from __future__ import annotations

import os
import time

import pytest
from runtime_apps import GPUS_PER_NODE

import prismserve  # noqa: F401  (telemetry off before Ray starts)


@pytest.fixture(scope="session")
def ray_cluster():
    """Head and worker node on this machine; the tests' runtimes join it."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "num_gpus": GPUS_PER_NODE, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE)
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
