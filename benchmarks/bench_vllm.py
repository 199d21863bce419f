"""Tiny vision-language models on this machine: the LLM on vLLM's engine vs on transformers, encoder
fissioned.

The model: the tiny random-weight checkpoint of `prismserve tiny` for `--family` (Qwen2.5-VL,
InternVL3 or Gemma 3; CPU). Two deployments on the Ray runtime with declared GPUs, each an image
encoder (transformers) and an LLM replica:
  vllm          the LLM on vLLM's async engine (continuous batching), in the vLLM environment
  transformers  the LLM on transformers (continuous batching, `HFEngine`)
Closed loop: `--clients` clients send requests back to back, half text -> text and half
image+text -> text (cars.jpg), `--max-tokens` at most (greedy; a random-weight model may end an
answer early, the tiny Gemma 3 its image answers at 18 tokens on both engines: tokens/s counts them).
`--rounds` rounds in which the two take turns, `--requests` per deployment in all, after a warm-up.
Reported per deployment, medians over its rounds: throughput (requests and text tokens), latency
P50, P90 and maximum, time to first text P50; and vllm / transformers ratios (per round, then the
median).
Needs the vLLM environment: `python3 -m prismserve vllm-env`.
Run: python benchmarks/bench_vllm.py [--family qwen2.5-vl|internvl3|gemma3] [--clients 8] [--requests 960]
     [--rounds 3] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

from bench_omni import load

import prismserve  # noqa: F401  (telemetry off)
from prismserve.demo import media
from prismserve.models import tiny
from prismserve.offline import go_offline
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.ray_runtime import RayRuntime

APP_SOURCE = """
from collections.abc import AsyncIterator
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.tasklib import MLLMTask, chat_chunks

vl = MLLMTask(model={model!r}, engine={engine!r}, vllm={vllm!r})

class Config(AppConfig):
    tasks = {{"vl": vl}}
    input_modalities = frozenset({{"text", "image"}})

async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:
    async for chunk in chat_chunks(await vl(request)):
        yield chunk
"""

# P90 and the maximum: a round is tens of requests, where a P99 would be the maximum by another name
# (`bench_omni.load` reports a P99 only from 100 requests a round).
METRICS = ("req_per_s", "tokens_per_s", "p50_s", "p90_s", "max_s", "ttft_p50_s")


async def measure(family: str, clients: int, total: int, rounds: int, max_tokens: int) -> dict[str, Any]:
    model = str(tiny.build(family))
    image, _, _ = media()
    cycle = [
        ChatRequest.of("What is prismserve?", max_tokens=max_tokens),
        ChatRequest.of("What is in the picture?", images=[image], max_tokens=max_tokens),
    ]
    runtime = RayRuntime(fake_gpus=4)
    await runtime.start()
    rows: dict[str, list[dict[str, float]]] = {"vllm": [], "transformers": []}
    try:
        apps = {
            engine: await runtime.register_app(
                APP_SOURCE.format(model=model, engine=engine, vllm={"dtype": "float32"}), engine
            )
            for engine in rows
        }
        for app in apps.values():
            await load(runtime, app, cycle, clients, clients)  # warm-up: one request per client
        for _ in range(rounds):
            for engine, app in apps.items():
                row = await load(runtime, app, cycle, clients, total // rounds)
                rows[engine].append(row)
                print(
                    f"{engine:<13} {row['req_per_s']:6.1f} req/s  {row['tokens_per_s']:6.0f} tokens/s  "
                    f"p50 {row['p50_s'] * 1e3:.0f} ms  p90 {row['p90_s'] * 1e3:.0f} ms  "
                    f"max {row['max_s'] * 1e3:.0f} ms  ttft p50 {row['ttft_p50_s'] * 1e3:.0f} ms",
                    flush=True,
                )
    finally:
        await runtime.close()
    results: dict[str, Any] = {
        name: {key: statistics.median(r[key] for r in runs) for key in METRICS} for name, runs in rows.items()
    }
    results["vllm_over_transformers"] = {
        key: statistics.median(
            a[key] / b[key] for a, b in zip(rows["vllm"], rows["transformers"], strict=True)
        )
        for key in METRICS
    }
    return results


def main() -> None:
    go_offline()  # the tiny checkpoint is built here: never reach the hub
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--requests",
        type=int,
        default=960,
        help="per deployment, after the warm-up (rounds of seconds, not a few 100 ms)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--family", choices=["qwen2.5-vl", "internvl3", "gemma3"], default="qwen2.5-vl")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(measure(args.family, args.clients, args.requests, args.rounds, args.max_tokens))
    results["family"], results["clients"] = args.family, args.clients
    print(
        f"\ntiny {args.family}, {args.clients} clients, medians of rounds   req/s  tokens/s  p50 ms  p90 ms  "
        "max ms  ttft p50 ms"
    )
    for name in ("vllm", "transformers"):
        row = results[name]
        print(
            f"LLM on {name:<38} {row['req_per_s']:6.1f} {row['tokens_per_s']:9.0f} {row['p50_s'] * 1e3:7.0f} "
            f"{row['p90_s'] * 1e3:7.0f} {row['max_s'] * 1e3:7.0f} {row['ttft_p50_s'] * 1e3:12.0f}"
        )
    ratio = results["vllm_over_transformers"]
    print(
        f"vllm / transformers (median of per-round ratios): throughput {ratio['req_per_s']:.2f}x, "
        f"tokens/s {ratio['tokens_per_s']:.2f}x, p50 {ratio['p50_s']:.2f}x, p90 {ratio['p90_s']:.2f}x, "
        f"max {ratio['max_s']:.2f}x, ttft p50 {ratio['ttft_p50_s']:.2f}x"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
