"""Tiny Qwen2.5-Omni on this machine: prismserve's split deployment vs the transformers monolith.

The model: the tiny random-weight Qwen2.5-Omni of `prismserve tiny` (real transformers code, CPU).
Deployments on the Ray runtime with declared GPUs, measured one after the other in the same run:
  split       image encoder, audio encoder, thinker, talker, vocoder: one replica each (5 GPUs)
  split_vllm  the same with the thinker on vLLM (`--engine vllm` or `both`; the vLLM environment):
              image encoder, thinker (it keeps the audio tower: vLLM takes audio raw), talker, vocoder
  monolith    transformers' own end-to-end `generate` in one deployment, 1 replica (1 GPU)
  monolith5   the same with 5 replicas (the split deployment's 5 GPUs)
Closed loop: `--clients` clients send requests back to back, cycling through text -> text,
image+text -> text and audio+text -> text+speech (cars.jpg and query_to_cars.wav of the shared
workloads). Two phases (monolith with 1 replica, then 5), each `--rounds` rounds in which the split
deployment(s) and the monolith take turns, `--requests` per deployment and phase in all, after a
warm-up. Reported per deployment, medians over its rounds: throughput (requests/s), end-to-end
latency P50/P99, time to first text P50, time to first audio P50 (speech requests); and split /
monolith ratios (with `both`, also split_vllm / split).
Speech answers run to `--max-codes` codec ids (the tiny talker never ends earlier: 250 are five
seconds of speech), so streaming has something to stream.
Run: python benchmarks/bench_omni.py [--clients 8] [--requests 96] [--rounds 3] [--max-codes 250]
     [--engine transformers|vllm|both] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import prismserve  # noqa: F401  (telemetry off)
from prismserve.demo import app_source, media
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
    """End-to-end latency, time to the first text and time to the first audio (None without audio)
    of one request, served as the gateway serves it."""
    start = time.perf_counter()
    first = first_audio = None
    async with runtime.request_scope(app.name):
        async for chunk in await app.serve(request):
            if chunk.text and first is None:
                first = time.perf_counter() - start
            if chunk.audio and first_audio is None:
                first_audio = time.perf_counter() - start
    return time.perf_counter() - start, first or time.perf_counter() - start, first_audio


async def load(runtime, app, cycle: list[ChatRequest], clients: int, total: int) -> dict[str, float]:
    """`total` requests from `clients` closed-loop clients; throughput and latency percentiles (and
    the time to first audio when some requests were spoken to)."""
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
    row = {
        "requests": total,
        "req_per_s": total / elapsed,
        "p50_s": statistics.median(ordered),
        "p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "ttft_p50_s": statistics.median(ttfts),
    }
    if ttfas:
        row["ttfa_p50_s"] = statistics.median(ttfas)
    return row


METRICS = ("req_per_s", "p50_s", "p99_s", "ttft_p50_s", "ttfa_p50_s")
SPLITS = {"transformers": ("split",), "vllm": ("split_vllm",), "both": ("split", "split_vllm")}


def omni_app(model: str, label: str, codes: int) -> str:
    """The Omni app of deployment `label`, speaking up to `codes` codec ids per answer."""
    if label == "split_vllm":
        return app_source(model, max_codes=codes, engine="vllm", vllm={"dtype": "float32"})
    return app_source(model, max_codes=codes, monolith=label != "split")


def show(label: str, row: dict[str, float]) -> str:
    """One table line of a deployment's figures."""
    ttfa = f"{row['ttfa_p50_s']:9.2f}" if "ttfa_p50_s" in row else f"{'-':>9}"
    return (
        f"{label:<12} {row['req_per_s']:6.2f} {row['p50_s']:7.2f} {row['p99_s']:7.2f} "
        f"{row['ttft_p50_s']:9.2f} {ttfa}"
    )


async def measure(
    clients: int, total: int, rounds: int, max_tokens: int, codes: int, engine: str
) -> dict[str, Any]:
    """Per deployment, the median over `rounds` rounds of `total / rounds` requests; the split
    deployments alternate round by round with the monolith they are compared with, so that the
    machine's drift touches all alike."""
    model = str(tiny.build("qwen2.5-omni"))
    image, audio, _ = media()
    cycle = requests(image, audio, max_tokens)
    runtime = RayRuntime(fake_gpus=12)
    await runtime.start()
    splits = SPLITS[engine]
    rows: dict[str, list[dict[str, float]]] = {label: [] for label in (*splits, "monolith", "monolith5")}
    rounds_of: dict[str, list[dict[str, dict[str, float]]]] = {"monolith": [], "monolith5": []}
    try:
        apps = {label: await runtime.register_app(omni_app(model, label, codes), label) for label in splits}
        whole = await runtime.register_app(omni_app(model, "whole", codes), "whole")
        for app in apps.values():
            await load(runtime, app, cycle, clients, clients)  # warm-up: one request per client
        for name, replicas in (("monolith", 1), ("monolith5", 5)):
            plan = {"cells": [{"gpus": 1, "count": replicas, "replicas": {"omni.whole": 1}}]}
            await runtime.deploy("whole", Plan.model_validate(plan))
            await load(runtime, whole, cycle, clients, clients)
            for _ in range(rounds):
                measured = {}
                for label, app in (*apps.items(), (name, whole)):
                    measured[label] = row = await load(runtime, app, cycle, clients, total // rounds)
                    rows[label].append(row)
                    print(show(label, row), flush=True)
                rounds_of[name].append(measured)
    finally:
        await runtime.close()
    results: dict[str, Any] = {"engine": engine}
    for label, runs in rows.items():
        results[label] = {key: statistics.median(r[key] for r in runs) for key in METRICS if key in runs[0]}

    def ratio(a: str, b: str, runs: list[dict[str, dict[str, float]]]) -> dict[str, float]:
        # Round by round (the two ran back to back), then the median.
        keys = [k for k in METRICS if k in runs[0][a] and k in runs[0][b]]
        return {k: statistics.median(r[a][k] / r[b][k] for r in runs) for k in keys}

    for label in splits:
        results[f"{label}_over"] = {name: ratio(label, name, runs) for name, runs in rounds_of.items()}
    if len(splits) == 2:
        every = rounds_of["monolith"] + rounds_of["monolith5"]
        results["split_vllm_over_split"] = ratio("split_vllm", "split", every)
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
    parser.add_argument(
        "--engine",
        choices=sorted(SPLITS),
        default="transformers",
        help="the split deployment's thinker: transformers, vllm (the vLLM environment), or both",
    )
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(
        measure(args.clients, args.requests, args.rounds, args.max_tokens, args.max_codes, args.engine)
    )
    print(
        f"\ntiny Qwen2.5-Omni, {args.clients} clients, medians of rounds\n"
        f"{'':<12}  req/s   p50 s   p99 s  ttft p50  ttfa p50"
    )
    for name in (*SPLITS[args.engine], "monolith", "monolith5"):
        print(show(name, results[name]))
    comparisons = [
        (f"{s} / {base}", r) for s in SPLITS[args.engine] for base, r in results[f"{s}_over"].items()
    ]
    if "split_vllm_over_split" in results:
        comparisons.append(("split_vllm / split", results["split_vllm_over_split"]))
    for title, ratio in comparisons:
        ttfa = f", ttfa p50 {ratio['ttfa_p50_s']:.2f}x" if "ttfa_p50_s" in ratio else ""
        print(
            f"{title} (median of per-round ratios): throughput {ratio['req_per_s']:.2f}x, "
            f"p50 {ratio['p50_s']:.2f}x, p99 {ratio['p99_s']:.2f}x, ttft p50 {ratio['ttft_p50_s']:.2f}x{ttfa}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
