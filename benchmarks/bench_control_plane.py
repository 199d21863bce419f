"""Control-plane overhead per request on the Ray runtime, with zero-latency `sim` executors.

The app is the toy MLLM; each request carries two images, so its graph has 3 invocations
(encoder, encoder, LLM streaming 4 tokens) that run on 3 replicas (Ray actors). The executors take
no time, so the measured latency is what prismserve adds: record, dispatch, Ray calls, data
plane, stream pulls, replay.
  latency     one request at a time: p50 / p99 in ms        (target: p50 <= 2 ms added)
  throughput  `--concurrency` requests in flight: req/s      (target: >= 300 req/s)
Run: python benchmarks/bench_control_plane.py [--requests 2000] [--concurrency 32] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import prismserve  # noqa: F401  (telemetry off)
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.task import use_dispatcher
from prismserve.toy import MLLM_APP_PATH
from prismserve.toy.executors import EXECUTORS, VALUES

APP = MLLM_APP_PATH.read_text()  # the toy MLLM: image encoder fissioned from the LLM

REQUEST = ChatRequest.of("one two three", images=[b"first image", b"second image"], max_tokens=4)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(runtime, app, dispatcher, requests: int) -> list[float]:
    samples = []
    with use_dispatcher(dispatcher):
        for _ in range(requests):
            start = time.perf_counter()
            async with runtime.request_scope(app.name):
                answer = await app.serve(REQUEST)
            samples.append(time.perf_counter() - start)
            assert len(answer.tokens) == 4
    return samples


async def throughput(runtime, app, dispatcher, requests: int, concurrency: int) -> float:
    remaining = iter(range(requests))

    async def client():
        with use_dispatcher(dispatcher):
            for _ in remaining:
                async with runtime.request_scope(app.name):
                    await app.serve(REQUEST)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return requests / (time.perf_counter() - start)


async def measure(requests: int, concurrency: int) -> dict[str, dict[str, float]]:
    runtime = RayRuntime(fake_gpus=4, values=VALUES)
    await runtime.start()
    try:
        app = await runtime.register_app(APP, "bench")
        assert len(app.tasks["mllm"].record(REQUEST)) == 3
        results = {}
        for name, dispatcher in (
            ("in-process (LocalDispatcher)", LocalDispatcher(EXECUTORS)),
            ("ray runtime", runtime.dispatcher),
        ):
            await latency(runtime, app, dispatcher, 50)  # warm-up
            samples = await latency(runtime, app, dispatcher, min(requests, 1000))
            rate = await throughput(runtime, app, dispatcher, requests, concurrency)
            results[name] = {
                "p50_ms": statistics.median(samples) * 1e3,
                "p99_ms": percentile(samples, 0.99) * 1e3,
                "req_per_s": rate,
            }
        return results
    finally:
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(measure(args.requests, args.concurrency))
    print(
        f"3-invocation graph, zero-latency executors   p50 ms   p99 ms    req/s  (concurrency {args.concurrency})"
    )
    for name, row in results.items():
        print(f"{name:<42} {row['p50_ms']:>7.2f} {row['p99_ms']:>8.2f} {row['req_per_s']:>8.0f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
