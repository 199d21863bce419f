"""One transformers LLM/thinker replica under concurrent clients: continuous batching (`HFEngine`)
vs one request at a time (transformers' `generate` per request, serialised — the path before it).

The model: a tiny random-weight checkpoint of `prismserve tiny` (real transformers code, CPU), its
LLM loaded with the encoders (raw media in). Closed loop: each of `--clients` clients sends requests
back to back, cycling through a text and an image+text prompt (cars.jpg), `--max-tokens` each (greedy,
so every mode generates the same tokens). For 8 and 32 clients, `--rounds` rounds in which the modes
take turns (the machine's drift touches all alike), `--requests` per mode and round:
  batched   HFEngine, up to 32 rows decoded together
  engine-1  HFEngine with one row (isolates batching from the engine's own overheads)
  serial    Adapter.generate (transformers' generate) one request at a time
Reported: medians over rounds of requests/s, generated tokens/s and P50 latency, and the median of
the per-round ratios batched / serial and batched / engine-1.
Run: python benchmarks/bench_hf_batching.py [--family qwen2.5-omni] [--clients 8 32] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import prismserve  # noqa: F401  (telemetry off)
from prismserve.bench.workloads import workloads_dir
from prismserve.executors.hf_engine import HFEngine
from prismserve.models import Generated, MediaInput, adapter_for, tiny
from prismserve.offline import go_offline
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import conversation

Generate = Callable[[dict[str, Any], int], Awaitable[Generated]]


def prompts(adapter: Any) -> list[dict[str, Any]]:
    """Model inputs of the prompt cycle (built before the clock starts)."""
    jpg = (workloads_dir() / "media" / "cars.jpg").read_bytes()
    out = []
    for request in (ChatRequest.of("What is prismserve?"), ChatRequest.of("What is here?", images=[jpg])):
        messages, media = conversation(request)
        out.append(adapter.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media]))
    return out


async def load(generate: Generate, cycle: list[dict[str, Any]], clients: int, total: int, max_tokens: int) -> dict[str, float]:  # fmt: skip
    """`total` requests from `clients` closed-loop clients: requests/s, tokens/s, P50 latency."""
    issued = iter(range(total))
    latencies: list[float] = []
    tokens = 0

    async def client(offset: int) -> None:
        nonlocal tokens
        for n in issued:
            start = time.perf_counter()
            generated = await generate(cycle[(n + offset) % len(cycle)], max_tokens)
            latencies.append(time.perf_counter() - start)
            tokens += len(generated.token_ids)

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - start
    return {
        "req_per_s": total / elapsed,
        "tok_per_s": tokens / elapsed,
        "p50_s": statistics.median(latencies),
    }


async def measure(family: str, client_counts: list[int], total: int, rounds: int, max_tokens: int) -> dict[str, Any]:  # fmt: skip
    """Per client count and mode, medians over rounds; ratios per round, then their median."""
    adapter = adapter_for(str(tiny.build(family)))
    adapter.load_llm(with_encoders=True)
    cycle = prompts(adapter)
    batched, single = HFEngine(adapter, max_batch=32), HFEngine(adapter, max_batch=1)
    modes: dict[str, Generate] = {
        "batched": lambda inputs, n: asyncio.wrap_future(batched.submit(inputs, n)),
        "engine-1": lambda inputs, n: asyncio.wrap_future(single.submit(inputs, n)),
        "serial": lambda inputs, n: asyncio.to_thread(adapter.generate, inputs, n),
    }
    results: dict[str, Any] = {}
    try:
        for clients in client_counts:
            for generate in modes.values():  # warm-up
                await load(generate, cycle, clients, clients, max_tokens)
            runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
            for _ in range(rounds):
                for mode, generate in modes.items():
                    row = await load(generate, cycle, clients, total, max_tokens)
                    runs[mode].append(row)
                    print(f"{clients:>3} clients {mode:<9} {row['req_per_s']:7.2f} req/s {row['tok_per_s']:8.1f} tok/s  p50 {row['p50_s']:.3f} s", flush=True)  # fmt: skip
            medians = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
            ratios = {
                f"batched/{base}": statistics.median(
                    a["tok_per_s"] / b["tok_per_s"] for a, b in zip(runs["batched"], runs[base], strict=True)
                )
                for base in ("serial", "engine-1")
            }
            results[str(clients)] = {**medians, "throughput_ratios": ratios, "peak_batch": batched.peak_batch}
    finally:
        batched.close()
        single.close()
    return results


def main() -> None:
    go_offline()  # the tiny checkpoint is built here: never reach the hub
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", default="qwen2.5-omni", help="a `prismserve tiny` family with an LLM")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--requests", type=int, default=64, help="per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(measure(args.family, args.clients, args.requests, args.rounds, args.max_tokens))
    print(f"\ntiny {args.family}, one replica, medians of {args.rounds} rounds   req/s    tok/s   p50 s")
    for clients, row in results.items():
        for mode in ("batched", "engine-1", "serial"):
            m = row[mode]
            print(
                f"{clients:>3} clients {mode:<36} {m['req_per_s']:7.2f} {m['tok_per_s']:8.1f} {m['p50_s']:7.3f}"
            )
        ratio = row["throughput_ratios"]
        print(f"{clients:>3} clients throughput batched / serial {ratio['batched/serial']:.2f}x, "
              f"batched / engine-1 {ratio['batched/engine-1']:.2f}x (peak batch {row['peak_batch']})")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
