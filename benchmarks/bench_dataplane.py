"""Data plane: a 32 MB tensor from a producer actor to a consumer actor on one node, or (with
--other-node) on two nodes of Ray's simulated cluster on this machine.

Paths compared, each timed from "the producer has the tensor" to "the consumer can use it":
  prismserve shm, view   producer writes into its pre-faulted slab; consumer maps it (zero-copy)
  prismserve shm, copy   same, consumer copies into a buffer of its own
  ray object store       producer returns the array; Ray moves it; consumer copies it out
With --other-node:
  prismserve wire        producer writes into its slab; the consumer, on another node, reads the
                         bytes over the producer's socket (TCP) as replicas do, and copies them out
  ray object store       as above, between the two nodes' object stores
Run: python benchmarks/bench_dataplane.py [--mb 32] [--repeats 30] [--other-node] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import prismserve  # noqa: F401  (telemetry off)
from prismserve.runtime.cluster import connect
from prismserve.runtime.dataplane import ShmSlab, current_node_id


class Producer:
    def __init__(self, nbytes: int) -> None:
        self.tensor = np.random.default_rng(0).random(nbytes // 8)
        self.slab = ShmSlab(4 * nbytes, current_node_id())
        self.count = 0

    def shm(self):
        self.count += 1
        data_id = f"t{self.count}"
        self.slab.free([f"t{self.count - 1}"])
        return self.slab.write(data_id, self.tensor)

    def object_store(self):
        return self.tensor

    def close(self) -> None:
        self.slab.close()


class Consumer:
    def __init__(self, nbytes: int) -> None:
        self.buffer = np.ones(nbytes // 8)  # reused, so its pages are already mapped

    def view(self, ref) -> float:
        array = ref.fetch()
        return float(array[0] + array[-1])

    def copy(self, ref) -> float:
        np.copyto(self.buffer, ref.fetch())
        return float(self.buffer[0] + self.buffer[-1])

    def take(self, array) -> float:
        np.copyto(self.buffer, array)
        return float(self.buffer[0] + self.buffer[-1])

    async def read(self, ref) -> float:
        np.copyto(self.buffer, await ref.fetch_async())
        return float(self.buffer[0] + self.buffer[-1])


class WireProducer(Producer):
    """A producer serving its slab's payloads on a socket, as a replica does (`read_data`)."""

    async def listen(self) -> None:
        import ray

        from prismserve.runtime.wire import WireServer

        self.server = WireServer(self, frozenset({"read_data"}))
        actor_id = ray.get_runtime_context().get_actor_id()
        self.slab.owner = await self.server.start(actor_id, self.slab.node_id, "127.0.0.1")

    def read_data(self, data_id: str) -> bytes:
        return self.slab.stored(data_id)


def measure(repeats: int, nbytes: int, other_node: bool = False) -> dict[str, dict[str, float]]:
    import ray

    if other_node:  # the producer on the node named "other", the consumer on the head
        producer = ray.remote(WireProducer).options(num_cpus=0, resources={"other": 0.001}).remote(nbytes)
        consumer = ray.remote(Consumer).options(num_cpus=0, resources={"head": 0.001}).remote(nbytes)
        ray.get(producer.listen.remote())
        paths = {
            "prismserve wire": lambda: consumer.read.remote(producer.shm.remote()),
            "ray object store": lambda: consumer.take.remote(producer.object_store.remote()),
        }
    else:
        producer = ray.remote(Producer).options(num_cpus=0).remote(nbytes)
        consumer = ray.remote(Consumer).options(num_cpus=0).remote(nbytes)
        paths = {
            "prismserve shm, view": lambda: consumer.view.remote(producer.shm.remote()),
            "prismserve shm, copy": lambda: consumer.copy.remote(producer.shm.remote()),
            "ray object store": lambda: consumer.take.remote(producer.object_store.remote()),
        }
    noop = ray.get(consumer.take.remote(np.zeros(nbytes // 8)))  # warm both actors up
    assert noop == 0
    results = {}
    for name, transfer in paths.items():
        for _ in range(3):
            ray.get(transfer())
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            ray.get(transfer())
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        results[name] = {"median_ms": median * 1e3, "gb_per_s": nbytes / median / 1e9, "repeats": repeats}
    ray.get(producer.close.remote())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--other-node", action="store_true", help="producer and consumer on two nodes")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    cluster = None
    if args.other_node:
        import ray
        from ray.cluster_utils import Cluster

        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "resources": {"head": 1}, "include_dashboard": False},
        )
        cluster.add_node(num_cpus=1, resources={"other": 1})
        ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
    else:
        connect(num_cpus=2)
    results = measure(args.repeats, args.mb << 20, args.other_node)
    where = "two nodes" if args.other_node else "one node"
    print(f"{args.mb} MB producer -> consumer, {where}   median ms   GB/s")
    for name, row in results.items():
        print(f"{name:<38} {row['median_ms']:>9.2f} {row['gb_per_s']:>6.2f}")
    if cluster is not None:
        ray.shutdown()
        cluster.shutdown()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
