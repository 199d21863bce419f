"""Cornserve Appendix D (Figure 12) and ModServe Figure 20: the data plane swept over size and rate.

A producer replica and a consumer replica (two Ray actors on this node) move one payload per
transfer, driven from this process the way the dispatcher drives a request: it asks the producer for
its output, hands that output to the consumer's call, waits for the consumer's acknowledgement and
releases the payload. Transports:
  shm, copy        prismserve's path: the producer writes into its pre-faulted slab, a `ShmRef`
                   travels over the replicas' sockets (runtime/wire.py), the consumer copies the bytes
                   into a buffer of its own (Cornserve's receiver copies them into GPU memory)
  shm, view        the same, the consumer keeps a zero-copy view
  socket inline    the payload itself pickled over the sockets (how payloads <= 64 KiB travel)
  ray object store the producer returns the array from a Ray actor call; Ray hands its reference to the
                   consumer's call (the path of payloads that do not fit a slab)
  same process     one memcpy: what the in-process pool's consumer pays when it needs its own copy
Measured: latency and bandwidth vs payload size (4 KiB ... 256 MiB); p50/p99 latency vs offered rate
(Poisson arrivals, one mid size); and, for ModServe's Figure 20, the transfer time of image
embeddings of realistic sizes (tokens x 3584 hidden x 2 bytes, Qwen2.5-VL-7B's LLM width).

Run: python3 benchmarks/paper/dataplane_sweep.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import prismserve  # noqa: E402, F401  (telemetry off)

RESULTS = Path(__file__).resolve().parents[1] / "results"
NAME = "dataplane_sweep"
HIDDEN, BYTES = 3584, 2  # Qwen2.5-VL-7B's LLM hidden size, bf16 (stored as float16: same bytes)
SIZES = [4 << 10 << (2 * i) for i in range(9)]  # 4 KiB ... 256 MiB, x4 apart
QUICK_SIZES = [4 << 10, 1 << 20, 16 << 20]
TOKENS = [256, 576, 1024, 2304, 4096, 8192, 16384]
QUICK_TOKENS = [256, 4096]
RATES = [10, 25, 50, 100, 200, 400]
QUICK_RATES = [20, 100]
RATE_BYTES = 4 << 20
TRANSPORTS = ["shm, copy", "shm, view", "socket inline", "ray object store", "same process"]
# Payloads above 64 KiB never travel inline (runtime/dataplane.py's INLINE_BYTES); larger ones are
# measured up to this size only, to show why: pickling them over the socket costs seconds at 64 MiB.
INLINE_MOST = 16 << 20
METHODS = frozenset({"produce_shm", "produce_inline", "release", "view", "copy", "take"})


class Endpoint:
    """A replica's data-plane side: a slab to write into, a socket to be called on, a buffer to copy into."""

    def __init__(self, max_bytes: int, slab_bytes: int) -> None:
        from prismserve.runtime.dataplane import ShmSlab, current_node_id

        self.source = np.random.default_rng(0).integers(0, 255, max_bytes, dtype=np.uint8)
        self.buffer = np.ones(max_bytes, dtype=np.uint8)  # reused: its pages are mapped already
        self.slab = ShmSlab(slab_bytes, current_node_id()) if slab_bytes else None

    async def serve(self) -> Any:
        """Listen on the replicas' transport; returns the address callers connect to."""
        import ray

        from prismserve.runtime.wire import WireServer

        self.wire = WireServer(self, METHODS)
        return await self.wire.start(ray.get_runtime_context().get_actor_id() or "", "", "127.0.0.1")

    def produce_shm(self, data_id: str, nbytes: int) -> Any:
        """A slab reference; when the slab is full (a rate the pair cannot keep up with), the payload
        goes to Ray's object store instead, as a replica's output does (`ExecutorReplica._store`)."""
        import ray

        from prismserve.runtime.replica import ObjectStoreRef

        assert self.slab is not None
        ref = self.slab.write(data_id, self.source[:nbytes])
        return ref if ref is not None else ObjectStoreRef(ray.put(self.source[:nbytes]))

    def produce_inline(self, nbytes: int) -> np.ndarray:
        return self.source[:nbytes]

    def object_store(self, nbytes: int) -> np.ndarray:
        return self.source[:nbytes]

    def release(self, data_ids: list[str]) -> None:
        if self.slab is not None:
            self.slab.free(data_ids)

    async def view(self, ref: Any) -> int:
        array = await ref.fetch_async()
        return int(array[0]) + int(array[-1])

    async def copy(self, ref: Any) -> int:
        return self.take(await ref.fetch_async())

    def take(self, array: np.ndarray) -> int:
        np.copyto(self.buffer[: array.nbytes], array)
        return int(self.buffer[0]) + int(self.buffer[array.nbytes - 1])

    def close(self) -> None:
        if self.slab is not None:
            self.slab.close()


class Pair:
    """A producer and a consumer replica, and one transfer over each transport."""

    def __init__(self, max_bytes: int, slab_bytes: int) -> None:
        import ray

        actor = ray.remote(Endpoint).options(num_cpus=0, max_concurrency=1000)
        self.producer = actor.remote(max_bytes, slab_bytes)
        self.consumer = actor.remote(max_bytes, 0)
        self.source = np.random.default_rng(1).integers(0, 255, max_bytes, dtype=np.uint8)
        self.buffer = np.ones(max_bytes, dtype=np.uint8)
        self.count = 0
        self.fallbacks = 0  # shm transfers that went through the object store: the slab was full

    async def start(self) -> None:
        from prismserve.runtime.wire import connection

        addresses = await asyncio.gather(self.producer.serve.remote(), self.consumer.serve.remote())
        self.to_producer, self.to_consumer = (connection(a) for a in addresses)

    def transfer(self, transport: str) -> Callable[[int], Awaitable[Any]]:
        return {
            "shm, copy": lambda n: self._shm(n, "copy"),
            "shm, view": lambda n: self._shm(n, "view"),
            "socket inline": self._inline,
            "ray object store": self._object_store,
            "same process": self._memcpy,
        }[transport]

    async def _shm(self, nbytes: int, how: str) -> Any:
        self.count += 1
        data_id = f"r{self.count}/0.out"
        ref = await self.to_producer.request("produce_shm", data_id, nbytes)
        self.fallbacks += not hasattr(ref, "path")
        result = await self.to_consumer.request(how, ref)
        self.to_producer.notify("release", [data_id])  # as the dispatcher releases a finished request
        return result

    async def _inline(self, nbytes: int) -> Any:
        return await self.to_consumer.request(
            "take", await self.to_producer.request("produce_inline", nbytes)
        )

    async def _object_store(self, nbytes: int) -> Any:
        return await self.consumer.take.remote(self.producer.object_store.remote(nbytes))

    async def _memcpy(self, nbytes: int) -> Any:
        np.copyto(self.buffer[:nbytes], self.source[:nbytes])

    async def close(self) -> None:
        await asyncio.gather(self.producer.close.remote(), self.consumer.close.remote())


async def timed(
    call: Callable[[int], Awaitable[Any]], nbytes: int, budget_s: float, most: int
) -> list[float]:
    """Seconds of sequential transfers after two warm-up ones: at least 5, at most `most`, for about
    `budget_s` (large payloads take fewer samples)."""
    for _ in range(2):
        await call(nbytes)
    samples: list[float] = []
    spent = time.perf_counter()
    while len(samples) < 5 or (len(samples) < most and time.perf_counter() - spent < budget_s):
        start = time.perf_counter()
        await call(nbytes)
        samples.append(time.perf_counter() - start)
    return samples


def summary(samples: list[float], nbytes: int) -> dict[str, float]:
    """Latency percentiles (ms) and bandwidth at the median (GB/s) of one size's samples."""
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    return {
        "bytes": nbytes,
        "samples": len(ordered),
        "p50_ms": p50 * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "gb_per_s": nbytes / p50 / 1e9,
    }


async def size_sweep(pair: Pair, sizes: list[int], budget_s: float) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {}
    for transport in TRANSPORTS:
        results[transport] = []
        for nbytes in sizes:
            if transport == "socket inline" and nbytes > INLINE_MOST:
                continue
            samples = await timed(pair.transfer(transport), nbytes, budget_s, 200)
            results[transport].append(summary(samples, nbytes))
            row = results[transport][-1]
            print(
                f"  {transport:<17} {nbytes:>11} B  p50 {row['p50_ms']:8.3f} ms  {row['gb_per_s']:6.2f} GB/s"
            )
    return results


async def embedding_sweep(
    pair: Pair, tokens: list[int], budget_s: float
) -> dict[str, list[dict[str, float]]]:
    """ModServe Figure 20: per-image transfer time of embeddings of `tokens` x HIDDEN x BYTES."""
    results: dict[str, list[dict[str, float]]] = {}
    for transport in ("shm, copy", "ray object store"):
        results[transport] = []
        for count in tokens:
            nbytes = count * HIDDEN * BYTES
            row = {
                "tokens": count,
                **summary(await timed(pair.transfer(transport), nbytes, budget_s, 300), nbytes),
            }
            results[transport].append(row)
            print(
                f"  {transport:<17} {count:>6} tokens  p50 {row['p50_ms']:8.3f}  p99 {row['p99_ms']:8.3f} ms"
            )
    return results


async def rate_sweep(
    pair: Pair, rates: list[int], seconds: float, nbytes: int
) -> dict[str, list[dict[str, float]]]:
    """Open-loop Poisson arrivals at each rate; every transfer's latency, from its arrival."""
    results: dict[str, list[dict[str, float]]] = {}
    rng = np.random.default_rng(0)
    for transport in ("shm, copy", "ray object store"):
        call = pair.transfer(transport)
        results[transport] = []
        for rate in rates:
            arrivals = np.cumsum(rng.exponential(1 / rate, max(5, int(rate * seconds))))
            latencies: list[float] = []

            async def one(at: float, begin: float, call=call, latencies=latencies) -> None:
                await asyncio.sleep(max(0.0, begin + at - time.perf_counter()))
                start = time.perf_counter()
                await call(nbytes)
                latencies.append(time.perf_counter() - start)

            pair.fallbacks = 0
            begin = time.perf_counter()
            await asyncio.gather(*(one(float(at), begin) for at in arrivals))
            elapsed = time.perf_counter() - begin
            row = {
                "offered_rps": rate,
                "achieved_rps": len(latencies) / elapsed,
                "slab_full_fallbacks": pair.fallbacks if transport.startswith("shm") else 0,
                **summary(latencies, nbytes),
            }
            results[transport].append(row)
            print(
                f"  {transport:<17} {rate:>4}/s offered  {row['achieved_rps']:7.1f}/s done  "
                f"p50 {row['p50_ms']:8.3f}  p99 {row['p99_ms']:8.3f} ms"
            )
    return results


async def measure(quick: bool) -> dict[str, Any]:
    sizes = QUICK_SIZES if quick else SIZES
    tokens = QUICK_TOKENS if quick else TOKENS
    biggest = max(max(sizes), max(tokens) * HIDDEN * BYTES, RATE_BYTES)
    # Room for the rate sweep's payloads in flight at once (when a rate overloads the pair).
    slab = max(2 * biggest, 160 * RATE_BYTES)
    load_before = os.getloadavg()
    pair = Pair(biggest, slab)
    await pair.start()
    try:
        print("latency and bandwidth vs size")
        by_size = await size_sweep(pair, sizes, 0.2 if quick else 0.8)
        print("image embeddings (ModServe Figure 20)")
        embeddings = await embedding_sweep(pair, tokens, 0.3 if quick else 2.0)
        print(f"latency vs offered rate, {RATE_BYTES >> 20} MiB payloads")
        by_rate = await rate_sweep(pair, QUICK_RATES if quick else RATES, 1.0 if quick else 3.0, RATE_BYTES)
    finally:
        await pair.close()
    return {
        "quick": quick,
        "machine": f"{os.cpu_count()} CPUs, one node, shared with other work",
        # 1-minute load average at the start and the end: how busy the shared machine was.
        "load_average": [load_before[0], os.getloadavg()[0]],
        "by_size": by_size,
        "embeddings": {"hidden": HIDDEN, "bytes_per_value": BYTES, "transports": embeddings},
        "by_rate": {"bytes": RATE_BYTES, "transports": by_rate},
    }


def plot(data: dict[str, Any], out: Path) -> list[Path]:
    """Latency vs size, bandwidth vs size, latency vs rate, embedding time vs tokens: one PNG each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = [
        ("latency_vs_size", data["by_size"], "bytes", "p50_ms", "payload (bytes)", "p50 latency (ms)"),
        ("bandwidth_vs_size", data["by_size"], "bytes", "gb_per_s", "payload (bytes)", "bandwidth at p50 (GB/s)"),
        ("latency_vs_rate", data["by_rate"]["transports"], "offered_rps", "p50_ms", "offered rate (transfers/s)",
         f"latency (ms), {data['by_rate']['bytes'] >> 20} MiB: p50 solid, p99 dashed"),
        ("fig20_embeddings", data["embeddings"]["transports"], "tokens", "p50_ms", "image tokens (x 3584 x 2 B)",
         "transfer time (ms): p50 solid, p99 dashed"),
    ]  # fmt: skip
    written = []
    for name, series, x, y, xlabel, ylabel in figures:
        fig, ax = plt.subplots(figsize=(6, 4))
        for transport, rows in series.items():
            line = ax.plot([r[x] for r in rows], [r[y] for r in rows], marker="o", label=transport)[0]
            if name in ("latency_vs_rate", "fig20_embeddings"):
                ax.plot([r[x] for r in rows], [r["p99_ms"] for r in rows], "--", color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set(xlabel=xlabel, ylabel=ylabel, title=f"prismserve data plane: {name.replace('_', ' ')}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{NAME}_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _load(results: Path) -> dict[str, Any] | None:
    path = results / f"{NAME}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _at(rows: list[dict[str, Any]], key: str, value: int) -> dict[str, Any]:
    return min(rows, key=lambda r: abs(r[key] - value))


WHY_FIG12 = (
    "theirs: GPU tensors between two nodes (GPU->CPU copy + RDMA over 400 Gbps); ours: CPU arrays "
    "through /dev/shm on one 2-core node, no GPU copy, no network"
)
WHY_FIG20 = (
    "theirs: GPU->GPU over InfiniBand with NCCL/GPU Direct RDMA (TCP: P50 100 ms, P99 180 ms); ours: "
    "CPU shared memory on one node, image sizes of theirs not given"
)


def rows(results: Path) -> list[tuple[str, str, str, str, str]]:
    """README rows from `dataplane_sweep.json` (never re-runs)."""
    data = _load(results)
    if data is None:
        return [("Cornserve Fig 12 / ModServe Fig 20: data plane", "-", "not run", "-", f"no {NAME}.json")]
    shm = data["by_size"]["shm, copy"]
    small, large = shm[0], shm[-1]
    rate = data["by_rate"]["transports"]["shm, copy"]
    emb = data["embeddings"]["transports"]["shm, copy"]
    typical = _at(emb, "tokens", 1024)
    p99_all = max(r["p99_ms"] for r in emb)
    return [
        (
            "Cornserve Fig 12: transfer latency vs size",
            "plot only: latency grows with size; small sizes dominated by CPU overhead of starting a transfer",
            f"shm copy p50 {small['p50_ms']:.2f} ms at {small['bytes'] >> 10} KiB, "
            f"{large['p50_ms']:.1f} ms at {large['bytes'] >> 20} MiB ({large['gb_per_s']:.1f} GB/s)",
            "-",
            WHY_FIG12,
        ),
        (
            "Cornserve Fig 12: transfer latency vs request rate",
            "plot only: latency grows with request rate",
            f"shm copy {data['by_rate']['bytes'] >> 20} MiB p50/p99 {rate[0]['p50_ms']:.1f}/"
            f"{rate[0]['p99_ms']:.1f} ms at {rate[0]['offered_rps']}/s, {rate[-1]['p50_ms']:.1f}/"
            f"{rate[-1]['p99_ms']:.1f} ms at {rate[-1]['offered_rps']}/s ({rate[-1]['achieved_rps']:.0f}/s done)",
            "-",
            WHY_FIG12,
        ),
        (
            "ModServe Fig 20: image-token transfer P99 per image (InfiniBand)",
            "5 ms",
            f"{typical['p99_ms']:.2f} ms at {typical['tokens']} tokens ({typical['bytes'] / 1e6:.1f} MB); "
            f"largest p99 {p99_all:.1f} ms ({emb[-1]['tokens']} tokens)",
            f"{typical['p99_ms'] / 5:.2f}",
            WHY_FIG20,
        ),
    ]


def details(results: Path) -> str:
    """Markdown tables of the sweep, for the README."""
    data = _load(results)
    if data is None:
        return ""
    transports = list(data["by_size"])
    lines = ["p50 latency in ms (bandwidth at p50 in GB/s) per payload size:", ""]
    lines.append("| size | " + " | ".join(transports) + " |")
    lines.append("|---" * (len(transports) + 1) + "|")
    for row in data["by_size"][transports[0]]:
        cells = []
        for transport in transports:
            found = [r for r in data["by_size"][transport] if r["bytes"] == row["bytes"]]
            cells.append(f"{found[0]['p50_ms']:.3f} ({found[0]['gb_per_s']:.2f})" if found else "not run")
        lines.append(f"| {_size(row['bytes'])} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"socket inline: not run above {_size(INLINE_MOST)} (payloads above 64 KiB go through the slab).",
    ]
    lines += [
        "",
        f"Latency vs offered rate, {_size(data['by_rate']['bytes'])} payloads (Poisson arrivals):",
        "",
    ]
    lines.append("| transport | offered /s | done /s | p50 ms | p99 ms | slab full: via object store |")
    lines.append("|---|---|---|---|---|---|")
    for transport, series in data["by_rate"]["transports"].items():
        for r in series:
            lines.append(
                f"| {transport} | {r['offered_rps']} | {r['achieved_rps']:.1f} | {r['p50_ms']:.2f} | "
                f"{r['p99_ms']:.2f} | {r['slab_full_fallbacks']} |"
            )
    hidden = data["embeddings"]["hidden"]
    lines += [
        "",
        f"Image embeddings (tokens x {hidden} x 2 bytes), per-image transfer time (ModServe Fig 20):",
        "",
    ]
    lines.append("| transport | tokens | MB | p50 ms | p99 ms |")
    lines.append("|---|---|---|---|---|")
    for transport, series in data["embeddings"]["transports"].items():
        for r in series:
            lines.append(
                f"| {transport} | {r['tokens']} | {r['bytes'] / 1e6:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |"
            )
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a few sizes and rates (< 1 minute)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and PNGs")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from prismserve.runtime.cluster import connect

    connect(num_cpus=2)
    try:
        data = asyncio.run(measure(args.quick))
    finally:
        import ray

        ray.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{NAME}.json").write_text(json.dumps(data, indent=2))
    for path in plot(data, args.out):
        print("wrote", path)
    for row in rows(args.out):
        print(" | ".join(row))


if __name__ == "__main__":
    main()
