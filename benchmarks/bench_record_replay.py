"""Record + replay overhead per request for a graph of 5 unit-task invocations.

The request (two images, audio output) makes the toy Omni composite invoke 5 unit tasks:
encoder, encoder, LLM, talker, vocoder, with small pydantic inputs. Measured per request:
  record+replay          the task layer alone (outputs from one earlier dispatch are reused)
  record+dispatch+replay the same through LocalDispatcher with the instant toy executors
Run: python benchmarks/bench_record_replay.py [--requests 10000] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import toy_fixture  # noqa: F401  (the toys are a test fixture)
from toy.executors import EXECUTORS
from toy.tasks import OmniTask

import prismserve  # noqa: F401  (telemetry off)
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(requests: int, warmup: int) -> dict[str, dict[str, float]]:
    omni = OmniTask(model_id="bench")
    request = ChatRequest.of("describe both and say it", images=[b"img-1", b"img-2"], audio_out=True)
    dispatcher = LocalDispatcher(EXECUTORS)
    graph = omni.record(request)
    assert len(graph) == 5, len(graph)
    outputs = await dispatcher.execute(graph)

    # Separate loops: the task layer's figure must not carry the dispatcher's garbage and cache misses.
    task_layer, end_to_end = [], []
    clock = time.perf_counter
    for i in range(warmup + requests):
        start = clock()
        recorded = omni.record(request)
        omni.replay(request, recorded, outputs)
        if i >= warmup:
            task_layer.append((clock() - start) * 1e6)
    for i in range(warmup + requests):
        start = clock()
        recorded = omni.record(request)
        omni.replay(request, recorded, await dispatcher.execute(recorded))
        if i >= warmup:
            end_to_end.append((clock() - start) * 1e6)
    return {
        name: {"median_us": statistics.median(s), "p99_us": percentile(s, 0.99), "requests": len(s)}
        for name, s in (("record+replay", task_layer), ("record+dispatch+replay", end_to_end))
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(measure(args.requests, args.warmup))
    print(
        f"{'per request, 5 invocations':<26} {'median µs':>10} {'p99 µs':>10}  (target: record+replay median <= 100)"
    )
    for name, row in results.items():
        print(f"{name:<26} {row['median_us']:>10.1f} {row['p99_us']:>10.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
