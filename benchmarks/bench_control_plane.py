"""Control-plane overhead per request on the Ray runtime, with zero-latency `sim` executors.

The app is the toy MLLM; each request carries two images, so its graph has 3 invocations
(encoder, encoder, LLM streaming 4 tokens) that run on 3 replicas (Ray actors). The executors take
no time, so the measured latency is what prismserve adds: record, dispatch, replica hops, data
plane, stream pulls, replay. Same run, three ways to carry the calls:
  in-process      LocalDispatcher: the same replicas in this process (no hop at all)
  ray calls       RayActorPool: each call a Ray actor call, producers' results as object references
  wire            WirePool (the default): Ray places and restarts the actors; calls, results and
                  stream reads travel over one Unix socket per replica (runtime/wire.py)
  latency     one request at a time: p50 / p99 in ms        (target: p50 <= 2 ms added)
  throughput  `--concurrency` requests in flight: req/s      (target: >= 500 req/s)
Then the per-hop breakdown of a request on each Ray pool (medians, one request at a time):
  record, submit (leases, pickling, sends), encoder hop (submit -> both encoders' results back),
  LLM hop (encoders' results -> the LLM's first batch back), replay (replay and the token stream),
  and the gateway: the round trip of an HTTP request through the real gateway (uvicorn), timed by
  an httpx client in another process, minus the same request served directly, text only. It holds
  the client's own cost too (building the request, parsing the JSON answer): an upper bound on
  what the gateway adds, not the gateway alone.
Run: python benchmarks/bench_control_plane.py [--requests 2000] [--concurrency 32] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time
from typing import Any

import toy_fixture  # noqa: F401  (the toys are a test fixture)
import uvicorn
from toy import MLLM_APP_PATH
from toy.executors import EXECUTORS, VALUES

import prismserve  # noqa: F401  (telemetry off)
from prismserve.gateway.server import create_gateway
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.runtime.pool import RayActorPool, WirePool
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.task import use_dispatcher

APP = MLLM_APP_PATH.read_text()  # the toy MLLM: image encoder fissioned from the LLM

REQUEST = ChatRequest.of("one two three", images=[b"first image", b"second image"], max_tokens=4)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(runtime, app, dispatcher, requests: int, request: ChatRequest = REQUEST) -> list[float]:
    samples = []
    with use_dispatcher(dispatcher):
        for _ in range(requests):
            start = time.perf_counter()
            async with runtime.request(app.name):
                answer = await app.serve(request)
            samples.append(time.perf_counter() - start)
            assert len(answer.tokens) == 4
    return samples


async def throughput(runtime, app, dispatcher, requests: int, concurrency: int) -> float:
    remaining = iter(range(requests))

    async def client():
        with use_dispatcher(dispatcher):
            for _ in remaining:
                async with runtime.request(app.name):
                    await app.serve(REQUEST)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return requests / (time.perf_counter() - start)


class TimedWire(WirePool):
    """The default pool, noting when the calls of the request being broken down leave and return."""

    marks: dict[str, float] | None = None

    def submit(self, replica, calls, producers, produced):
        refs = super().submit(replica, calls, producers, produced)
        marks = self.marks
        if marks is not None:
            marks["submitted"] = time.perf_counter()
            for call, ref in zip(calls, refs, strict=True):
                ref.add_done_callback(
                    lambda _, i=call.index: marks.setdefault(f"done{i}", time.perf_counter())
                )
        return refs


async def breakdown(runtime, app, pool: TimedWire, requests: int) -> dict[str, float]:
    """Median ms of each consecutive phase of a request (their sum is the request's time)."""
    task, clock = app.tasks["mllm"], time.perf_counter
    phases: dict[str, list[float]] = {}
    for _ in range(requests):
        pool.marks = marks = {}
        async with runtime.request(app.name):
            start = clock()
            graph = task.record(REQUEST)
            recorded = clock()
            outputs = await runtime.dispatcher.execute(graph)
            answer = task.replay(REQUEST, graph, outputs)
            assert len(await answer.text.collect()) == 4
            end = clock()
        encoders = max(marks["done0"], marks["done1"])
        for name, seconds in (
            ("record", recorded - start),
            ("submit (leases, pickling, sends)", marks["submitted"] - recorded),
            ("encoder hop (both encoders' results back)", encoders - marks["submitted"]),
            ("LLM hop (its first batch back)", marks["done2"] - encoders),
            ("replay, tokens to the app", end - marks["done2"]),
            ("total", end - start),
        ):
            phases.setdefault(name, []).append(seconds * 1e3)
    pool.marks = None
    return {name: statistics.median(samples) for name, samples in phases.items()}


_CLIENT = """
import json, statistics, sys, time, httpx
url, body, requests = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
samples = []
with httpx.Client() as client:
    for i in range(20 + requests):
        start = time.perf_counter()
        response = client.post(url, json=body)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200 and len(response.json()["tokens"]) == 4, response.text
print(statistics.median(samples[20:]))
"""


async def gateway_hop(runtime, app, requests: int) -> float:
    """Median ms an HTTP round trip through the gateway adds to the same (text-only) request served
    directly, as the client times it: the httpx client's own work (request building, JSON parsing)
    is inside, so this bounds the gateway's cost from above. The client is another process: one in
    this process's event loop meets delayed ACKs."""
    text = ChatRequest.of("one two three", max_tokens=4)
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on such sockets (else +40 ms delayed ACKs).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(create_gateway(runtime, admin_token="bench"), log_level="warning", access_log=False)
    )
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        direct = await latency(runtime, app, runtime.dispatcher, requests, text)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/apps/{app.name}/invoke"
        body = json.dumps(text.model_dump(mode="json"))
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CLIENT, url, body, str(requests), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await client.communicate()
        assert client.returncode == 0, "the HTTP client failed"
    finally:
        server.should_exit = True
        await serving
    return (float(out) - statistics.median(direct)) * 1e3


async def run(runtime, app, dispatcher, requests: int, concurrency: int) -> dict[str, float]:
    await latency(runtime, app, dispatcher, 50)  # warm-up
    samples = await latency(runtime, app, dispatcher, min(requests, 1000))
    rate = await throughput(runtime, app, dispatcher, requests, concurrency)
    return {
        "p50_ms": statistics.median(samples) * 1e3,
        "p99_ms": percentile(samples, 0.99) * 1e3,
        "req_per_s": rate,
    }


async def measure(requests: int, concurrency: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, pool in (
        ("ray calls (RayActorPool)", RayActorPool()),
        ("wire (WirePool, default)", TimedWire()),
    ):
        runtime = RayRuntime(fake_gpus=4, values=VALUES, pool=pool)
        await runtime.start()
        try:
            app = await runtime.register_app(APP, "bench")
            assert len(app.tasks["mllm"].record(REQUEST)) == 3
            if not results:
                local = LocalDispatcher(EXECUTORS)
                results["in-process (LocalDispatcher)"] = await run(
                    runtime, app, local, requests, concurrency
                )
            results[name] = await run(runtime, app, runtime.dispatcher, requests, concurrency)
            if isinstance(pool, TimedWire):
                hops = await breakdown(runtime, app, pool, min(requests, 1000))
                results["breakdown_ms"] = {
                    "gateway (HTTP in, JSON out)": await gateway_hop(runtime, app, min(requests, 500)),
                    **hops,
                }
        finally:
            await runtime.close()
    return results


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
        if name != "breakdown_ms":
            print(f"{name:<42} {row['p50_ms']:>7.2f} {row['p99_ms']:>8.2f} {row['req_per_s']:>8.0f}")
    print("\nper-hop breakdown on the wire pool, one request at a time (median ms)")
    for name, ms in results["breakdown_ms"].items():
        print(f"  {name:<44} {ms:>6.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
