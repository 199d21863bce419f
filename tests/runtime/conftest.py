"""One Ray session for the whole run: a simulated two-node cluster with 4 declared GPUs per node, on
which model replicas run on the CPU (`PRISMSERVE_DEVICE=cpu`, as `--fake-gpus` sets it)."""

from __future__ import annotations

import os

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
