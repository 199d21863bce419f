"""Request-static vs dynamic (least-loaded) routing on the same deployment (000 §7.4).

Deployment: the toy MLLM with encoder fission on declared GPUs, `sim` executors with service times
(encoder 20 ms, LLM 30 ms prefill + 16 tokens x 4 ms, batching up to 8), 2 encoder and 3 LLM replicas.
Closed loop: `--clients` clients send requests back to back (half with one image) for `--seconds`.
  static   path from the plan, replica by the dispatcher's own in-flight counts: no executor is asked anything
  dynamic  before every invocation the dispatcher asks each replica of that step for its queue depth
Run: python benchmarks/bench_routing.py [--clients 48] [--seconds 20] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import toy_fixture  # noqa: F401  (the toys are a test fixture)
from toy import MLLM_APP_PATH

import prismserve  # noqa: F401  (telemetry off)
from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.task import use_dispatcher

APP = MLLM_APP_PATH.read_text()  # the toy MLLM: image encoder fissioned from the LLM

PLAN = {
    "cells": [
        {"gpus": 1, "count": 2, "replicas": {"mllm.encoders.image": 1}},
        {"gpus": 1, "count": 3, "replicas": {"mllm.llm": 1}},
    ],
    "profiles": {
        "mllm.encoders.image": {"latency_s": 0.020, "batch_growth": 0.1, "max_batch": 8},
        "mllm.llm": {"latency_s": 0.030, "batch_growth": 0.05, "max_batch": 8, "items": 16, "item_s": 0.004},
    },
}


async def run_policy(runtime, app, policy: str, clients: int, seconds: float) -> dict[str, float]:
    runtime.policy = policy
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client(k: int):
        i = 0
        with use_dispatcher(runtime.dispatcher):
            while time.perf_counter() < deadline:
                request = ChatRequest.of(f"c{k} r{i}", images=[b"img"] if (k + i) % 2 else [])
                start = time.perf_counter()
                async with runtime.request(app.name):
                    await app.serve(request)
                latencies.append(time.perf_counter() - start)
                i += 1

    start = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    makespan = time.perf_counter() - start
    return {
        "requests": len(latencies),
        "req_per_s": len(latencies) / makespan,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": sorted(latencies)[int(0.99 * (len(latencies) - 1))] * 1e3,
    }


async def measure(clients: int, seconds: float) -> dict[str, dict[str, float]]:
    runtime = RayRuntime(fake_gpus=8)
    await runtime.start()
    try:
        app = await runtime.register_app(APP, "bench")
        await runtime.deploy("bench", Plan.model_validate(PLAN))
        await run_policy(runtime, app, "static", clients, 3)  # warm-up
        return {
            policy: await run_policy(runtime, app, policy, clients, seconds)
            for policy in ("static", "dynamic")
        }
    finally:
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(measure(args.clients, args.seconds))
    print(
        f"routing    requests   req/s   p50 ms   p99 ms   ({args.clients} closed-loop clients, {args.seconds:.0f} s)"
    )
    for policy, row in results.items():
        print(
            f"{policy:<8} {row['requests']:>9} {row['req_per_s']:>7.1f} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f}"
        )
    ratio = results["static"]["req_per_s"] / results["dynamic"]["req_per_s"]
    print(f"static / dynamic throughput: {ratio:.2f}x  (paper, 000 §7.4: 3.7x)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**results, "static_over_dynamic": ratio}, f, indent=2)


if __name__ == "__main__":
    main()
