"""Tiny Qwen2.5-Omni on this machine: prismserve's split deployment vs the transformers monolith.

The model: the tiny random-weight Qwen2.5-Omni of `prismserve tiny` (real transformers code, CPU).
Deployments on the Ray runtime with declared GPUs, measured one after the other in the same run:
  split      image encoder, audio encoder, thinker, talker, vocoder: one replica each (5 GPUs)
  monolith   transformers' own end-to-end `generate` in one deployment, 1 replica (1 GPU)
  monolith5  the same with 5 replicas (the split deployment's 5 GPUs)
Closed loop: `--clients` clients send requests back to back, cycling through text -> text,
image+text -> text and audio+text -> text+speech (cars.jpg and query_to_cars.wav of the shared
workloads). Two phases (monolith with 1 replica, then 5), each `--rounds` rounds in which the split
deployment and the monolith take turns, `--requests` per deployment and phase in all, after a
warm-up. Reported per deployment, medians over its rounds: throughput (requests/s), end-to-end
latency P50/P99, time to first text P50, time to first audio P50 (speech requests); and split /
monolith ratios.
Run: python benchmarks/bench_omni.py [--clients 8] [--requests 96] [--rounds 3] [--max-codes 250] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import prismserve  # noqa: F401  (telemetry off)
from prismserve.demo import APP_SOURCE, media
from prismserve.offline import go_offline
from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.task import use_dispatcher
from prismserve.testing import tiny


def requests(image: bytes, audio: bytes, max_tokens: int) -> list[ChatRequest]:
    """The cycle of request types every client sends."""
    return [
        ChatRequest.of("What is prismserve?", max_tokens=max_tokens),
        ChatRequest.of("What is in the picture?", images=[image], max_tokens=max_tokens),
        ChatRequest.of("Answer aloud.", audios=[audio], audio_out=True, max_tokens=max_tokens),
    ]


async def one(app, request: ChatRequest, runtime) -> tuple[float, float, float | None]:
    """End-to-end latency, time to the first text and (speech asked for) time to the first audio of
    one request, served as the gateway serves it."""
    start = time.perf_counter()
    first_text = first_audio = None
    async with runtime.request_scope(app.name):
        async for chunk in await app.serve(request):
            if chunk.text and first_text is None:
                first_text = time.perf_counter() - start
            if chunk.audio and first_audio is None:
                first_audio = time.perf_counter() - start
    end = time.perf_counter() - start
    return end, first_text or end, first_audio if request.wants_audio else None


async def load(runtime, app, cycle: list[ChatRequest], clients: int, total: int) -> dict[str, float]:
    """`total` requests from `clients` closed-loop clients; throughput and latency percentiles."""
    latencies, ttfts, ttfas = [], [], []
    issued = iter(range(total))

    async def client(offset: int) -> None:
        with use_dispatcher(runtime.dispatcher):
            for n in issued:
                latency, ttft, ttfa = await one(app, cycle[(n + offset) % len(cycle)], runtime)
                latencies.append(latency)
                ttfts.append(ttft)
                if ttfa is not None:
                    ttfas.append(ttfa)

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - start
    ordered = sorted(latencies)
    return {
        "requests": total,
        "req_per_s": total / elapsed,
        "p50_s": statistics.median(ordered),
        "p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "ttft_p50_s": statistics.median(ttfts),
        "ttfa_p50_s": statistics.median(ttfas) if ttfas else float("nan"),
    }


async def measure(clients: int, total: int, rounds: int, max_tokens: int, codes: int) -> dict[str, Any]:
    """Per deployment, the median over `rounds` rounds of `total / rounds` requests; the split
    deployment alternates round by round with the monolith it is compared with, so that the
    machine's drift touches both alike."""
    model = str(tiny.build("qwen2.5-omni"))
    image, audio, _ = media()
    cycle = requests(image, audio, max_tokens)
    runtime = RayRuntime(fake_gpus=10)
    await runtime.start()
    rows: dict[str, list[dict[str, float]]] = {"split": [], "monolith": [], "monolith5": []}
    pairs: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {"monolith": [], "monolith5": []}
    try:
        split = await runtime.register_app(
            APP_SOURCE.format(model=model, max_codes=codes, monolith=False), "split"
        )
        whole = await runtime.register_app(
            APP_SOURCE.format(model=model, max_codes=codes, monolith=True), "whole"
        )
        await load(runtime, split, cycle, clients, clients)  # warm-up: one request per client
        for name, replicas in (("monolith", 1), ("monolith5", 5)):
            plan = {"cells": [{"gpus": 1, "count": replicas, "replicas": {"omni.whole": 1}}]}
            await runtime.deploy("whole", Plan.model_validate(plan))
            await load(runtime, whole, cycle, clients, clients)
            for _ in range(rounds):
                pair = []
                for label, app in (("split", split), (name, whole)):
                    row = await load(runtime, app, cycle, clients, total // rounds)
                    rows[label].append(row)
                    pair.append(row)
                    print(
                        f"{label:<10} {row['req_per_s']:6.2f} req/s  p50 {row['p50_s']:.2f} s  "
                        f"p99 {row['p99_s']:.2f} s  ttft p50 {row['ttft_p50_s']:.2f} s  "
                        f"ttfa p50 {row['ttfa_p50_s']:.2f} s",
                        flush=True,
                    )
                pairs[name].append((pair[0], pair[1]))
    finally:
        await runtime.close()
    results: dict[str, Any] = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in rows.items()
    }
    # Ratios round by round (split and the monolith ran back to back), then their median.
    results["split_over"] = {
        name: {
            key: statistics.median(a[key] / b[key] for a, b in runs)
            for key in ("req_per_s", "p50_s", "p99_s", "ttft_p50_s", "ttfa_p50_s")
        }
        for name, runs in pairs.items()
    }
    return results


def main() -> None:
    go_offline()  # the tiny checkpoint is built here: never reach the hub
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--requests", type=int, default=96, help="per deployment and phase, after the warm-up"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per phase (medians are reported)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--max-codes", type=int, default=250, help="codec ids per spoken answer (250: five seconds of speech)"
    )
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(measure(args.clients, args.requests, args.rounds, args.max_tokens, args.max_codes))
    print(
        f"\ntiny Qwen2.5-Omni, {args.clients} clients, medians of rounds      req/s   p50 s   p99 s  ttft p50 s"
        "  ttfa p50 s"
    )
    for name in ("split", "monolith", "monolith5"):
        row = results[name]
        print(
            f"{name:<48} {row['req_per_s']:6.2f} {row['p50_s']:7.2f} {row['p99_s']:7.2f} {row['ttft_p50_s']:9.2f}"
            f" {row['ttfa_p50_s']:10.2f}"
        )
    for base, ratio in results["split_over"].items():
        print(
            f"split / {base} (median of per-round ratios): throughput {ratio['req_per_s']:.2f}x, "
            f"p50 {ratio['p50_s']:.2f}x, p99 {ratio['p99_s']:.2f}x, ttft p50 {ratio['ttft_p50_s']:.2f}x, "
            f"ttfa p50 {ratio['ttfa_p50_s']:.2f}x"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
