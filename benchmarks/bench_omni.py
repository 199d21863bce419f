"""Tiny Omni models on this machine: prismserve's split deployment vs the transformers monolith on the
same number of replicas.

The model: the tiny random-weight Qwen2.5-Omni or Qwen3-Omni of `prismserve tiny` (`--family`; real
transformers and vLLM code, CPU). Deployments on the Ray runtime with declared GPUs, measured one
after the other in the same run, one replica per deployment:
  split       image encoder, audio encoder, thinker (transformers, continuous batching), talker,
              vocoder: 5 replicas
  split_vllm  the thinker on vLLM (`--engine vllm` or `both`; the vLLM environment): image encoder,
              thinker (it keeps the audio tower: vLLM takes audio raw), talker, vocoder: 4 replicas
  monolithN   transformers' own end-to-end `generate` in one deployment, N replicas: as many as the
              split deployment it is compared with
Closed loop: `--clients` clients send requests back to back, a third each text -> text,
image+text -> text and audio+text -> text+speech (cars.jpg and query_to_cars.wav of the shared
workloads; the n-th request issued is the n-th of that cycle, whichever client sends it). For each N, `--rounds` rounds in which the split deployment(s) of N replicas and the
monolith of N take turns, `--requests` per deployment in all, after a warm-up. Reported per
deployment, medians over its rounds: throughput (requests and text tokens a second), end-to-end latency P50, P90 and
maximum (a P99 too where a round has 100 requests or more), time to first text P50, time to
first audio P50 (speech requests); and split / monolith ratios (per round, then the median).
Speech answers run to `--max-codes` codec ids (the tiny talkers never end earlier; 250 are five
seconds of Qwen2.5-Omni's speech), so streaming has something to stream.
Where the time goes: each component's CPU seconds per request over the measured rounds (its
replicas' processes and their children, from /proc; Linux), medians of rounds.
Run: python benchmarks/bench_omni.py [--family qwen2.5-omni|qwen3-omni] [--clients 8] [--requests 96]
     [--rounds 3] [--max-codes 250] [--engine transformers|vllm|both] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import prismserve  # noqa: F401  (telemetry off)
from prismserve.apps import demo_app_source
from prismserve.demo import media
from prismserve.models import tiny
from prismserve.offline import go_offline
from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.task import use_dispatcher


def requests(image: bytes, audio: bytes, max_tokens: int) -> list[ChatRequest]:
    """The cycle of request types every client sends."""
    return [
        ChatRequest.of("What is prismserve?", max_tokens=max_tokens),
        ChatRequest.of("What is in the picture?", images=[image], max_tokens=max_tokens),
        ChatRequest.of("Answer aloud.", audios=[audio], audio_out=True, max_tokens=max_tokens),
    ]


async def one(app, request: ChatRequest, runtime) -> tuple[float, float, float | None, int]:
    """End-to-end latency, time to the first text, time to the first audio (None without audio) and
    the text tokens (as the engine counts them; a text chunk is one where it does not) of one
    request, served as the gateway serves it."""
    start = time.perf_counter()
    first = first_audio = None
    tokens = 0
    async with runtime.request(app.name):
        async for chunk in await app.serve(request):
            if chunk.text and first is None:
                first = time.perf_counter() - start
            if chunk.audio and first_audio is None:
                first_audio = time.perf_counter() - start
            if chunk.text or chunk.tokens:
                tokens += chunk.tokens if chunk.tokens is not None else 1
    return time.perf_counter() - start, first or time.perf_counter() - start, first_audio, tokens


async def load(runtime, app, cycle: list[ChatRequest], clients: int, total: int) -> dict[str, float]:
    """`total` requests from `clients` closed-loop clients; throughput (requests and text tokens)
    and latency percentiles (and the time to first audio when some requests were spoken to)."""
    latencies, ttfts, ttfas, tokens = [], [], [], []
    issued = iter(range(total))

    async def client() -> None:
        with use_dispatcher(runtime.dispatcher):
            for n in issued:
                # The n-th request issued is of the cycle's n-th type, whichever client sends it: the
                # mix is the cycle's. (Offset by the client's number, clients in lockstep each sent
                # one type only: with 8 clients and a cycle of two, every request was text.)
                latency, ttft, ttfa, count = await one(app, cycle[n % len(cycle)], runtime)
                latencies.append(latency)
                tokens.append(count)
                ttfts.append(ttft)
                if ttfa is not None:
                    ttfas.append(ttfa)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    ordered = sorted(latencies)
    row = {
        "requests": total,
        "req_per_s": total / elapsed,
        # Requests that stop early (a random-weight model's end token) are cheaper: tokens/s says so.
        "tokens_per_s": sum(tokens) / elapsed,
        "p50_s": statistics.median(ordered),
        "p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        # A round is tens of requests: a P99 of fewer than 100 would be their maximum, so the
        # maximum is reported as such (and a P99 only where 100 or more make one).
        "max_s": ordered[-1],
        "ttft_p50_s": statistics.median(ttfts),
    }
    if len(ordered) >= 100:
        row["p99_s"] = ordered[int(0.99 * len(ordered))]
    if ttfas:
        row["ttfa_p50_s"] = statistics.median(ttfas)
    return row


def process_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes and their descendants have used (Linux /proc;
    0 elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    used: dict[int, float] = {}
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, stack = 0.0, list(pids)
    while stack:
        pid = stack.pop()
        total += used.get(pid, 0.0)
        stack += children.get(pid, [])
    return total


def component_cpu(runtime: RayRuntime, app: str) -> dict[str, float]:
    """CPU seconds used so far by each component (its unit task's class) of `app`'s deployments."""
    used: dict[str, float] = {}
    for key, deployment in runtime.status()["deployments"].items():
        if app in deployment["apps"]:
            component = key.split(":")[0].rsplit(".", 1)[-1]
            pids = [r["pid"] for r in deployment["replicas"] if "pid" in r]
            used[component] = used.get(component, 0.0) + process_cpu(pids)
    return used


METRICS = ("req_per_s", "p50_s", "p90_s", "max_s", "p99_s", "ttft_p50_s", "ttfa_p50_s")
SPLITS = {"transformers": ("split",), "vllm": ("split_vllm",), "both": ("split", "split_vllm")}


def omni_app(model: str, label: str, codes: int) -> str:
    """The Omni app of deployment `label`, speaking up to `codes` codec ids per answer."""
    if label == "split_vllm":
        return demo_app_source(model, max_codes=codes, engine="vllm", vllm={"dtype": "float32"})
    return demo_app_source(model, max_codes=codes, monolith=label != "split")


def show(label: str, row: dict[str, float]) -> str:
    """One table line of a deployment's figures."""
    ttfa = f"{row['ttfa_p50_s']:9.2f}" if "ttfa_p50_s" in row else f"{'-':>9}"
    return (
        f"{label:<12} {row['req_per_s']:6.2f} {row['p50_s']:7.2f} {row['p90_s']:7.2f} {row['max_s']:7.2f} "
        f"{row['ttft_p50_s']:9.2f} {ttfa}"
    )


async def measure(
    family: str, clients: int, total: int, rounds: int, max_tokens: int, codes: int, engine: str
) -> dict[str, Any]:
    """Per deployment, the median over `rounds` rounds of `total / rounds` requests; the split
    deployments alternate round by round with the monolith they are compared with, so that the
    machine's drift touches all alike."""
    model = str(tiny.build(family))
    image, audio, _ = media()
    cycle = requests(image, audio, max_tokens)
    runtime = RayRuntime(fake_gpus=16)
    await runtime.start()
    rows: dict[str, list[dict[str, float]]] = {}
    cpu: dict[str, list[dict[str, float]]] = {}  # per round: each component's CPU s per request
    rounds_of: dict[str, list[dict[str, dict[str, float]]]] = {}
    results: dict[str, Any] = {"family": family, "engine": engine, "clients": clients}
    try:
        apps = {
            label: await runtime.register_app(omni_app(model, label, codes), label)
            for label in SPLITS[engine]
        }
        whole = await runtime.register_app(omni_app(model, "whole", codes), "whole")
        replicas = {label: len(app.named_unit_tasks()) for label, app in apps.items()}
        results["replicas"] = replicas
        for app in apps.values():
            await load(runtime, app, cycle, clients, clients)  # warm-up: one request per client
        for n in sorted(set(replicas.values())):
            baseline = f"monolith{n}"
            plan = {"cells": [{"gpus": 1, "count": n, "replicas": {"model.whole": 1}}]}
            await runtime.deploy("whole", Plan.model_validate(plan))
            await load(runtime, whole, cycle, clients, clients)
            compared = [(label, app) for label, app in apps.items() if replicas[label] == n]
            for _ in range(rounds):
                measured = {}
                for label, app in (*compared, (baseline, whole)):
                    before = component_cpu(runtime, app.name)
                    measured[label] = row = await load(runtime, app, cycle, clients, total // rounds)
                    after = component_cpu(runtime, app.name)
                    cpu.setdefault(label, []).append(
                        {c: (after[c] - before[c]) / row["requests"] for c in after}
                    )
                    rows.setdefault(label, []).append(row)
                    print(show(label, row), flush=True)
                rounds_of.setdefault(baseline, []).append(measured)
    finally:
        await runtime.close()
    for label, runs in rows.items():
        results[label] = {key: statistics.median(r[key] for r in runs) for key in METRICS if key in runs[0]}
        results[label]["cpu_s_per_request"] = {
            c: statistics.median(r[c] for r in cpu[label]) for c in cpu[label][0]
        }
    for label, n in replicas.items():
        runs = rounds_of[f"monolith{n}"]
        # Round by round (the two ran back to back), then the median.
        keys = [k for k in METRICS if k in runs[0][label] and k in runs[0][f"monolith{n}"]]
        results[f"{label}_over_monolith{n}"] = {
            k: statistics.median(r[label][k] / r[f"monolith{n}"][k] for r in runs) for k in keys
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
    parser.add_argument(
        "--engine",
        choices=sorted(SPLITS),
        default="transformers",
        help="the split deployment's thinker: transformers, vllm (the vLLM environment), or both",
    )
    parser.add_argument("--family", choices=["qwen2.5-omni", "qwen3-omni"], default="qwen2.5-omni")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(
        measure(
            args.family,
            args.clients,
            args.requests,
            args.rounds,
            args.max_tokens,
            args.max_codes,
            args.engine,
        )
    )
    print(
        f"\ntiny {args.family}, {args.clients} clients, medians of rounds\n"
        f"{'':<12}  req/s   p50 s   p90 s   max s  ttft p50  ttfa p50"
    )
    labels = [k for k in results if isinstance(results[k], dict) and "req_per_s" in results[k]]
    for name in labels:
        if "_over_" not in name:
            print(show(name, results[name]))
    print("\nCPU seconds per request, per component (its replicas' processes), medians of rounds")
    for name in labels:
        if "_over_" not in name:
            used = results[name]["cpu_s_per_request"]
            parts = ", ".join(f"{c} {s:.3f}" for c, s in sorted(used.items()))
            print(f"{name:<12} {sum(used.values()):.3f}: {parts}")
    for name in labels:
        if "_over_" in name:
            ratio = results[name]
            ttfa = f", ttfa p50 {ratio['ttfa_p50_s']:.2f}x" if "ttfa_p50_s" in ratio else ""
            print(
                f"{name.replace('_over_', ' / ')} (median of per-round ratios): throughput "
                f"{ratio['req_per_s']:.2f}x, p50 {ratio['p50_s']:.2f}x, p90 {ratio['p90_s']:.2f}x, "
                f"max {ratio['max_s']:.2f}x, "
                f"ttft p50 {ratio['ttft_p50_s']:.2f}x{ttfa}"
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
