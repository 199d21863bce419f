"""Hop options for the control plane, measured in one run (issue: sub-2 ms dispatch).

One request of the control-plane benchmark crosses at least two replica hops (encoder -> LLM,
then the LLM's stream back). This prints what one hop and a two-hop chain cost over each
transport the runtime could use, with zero-work calls:
  ray call           an async Ray actor method, awaited by the caller (today's hop)
  ray chain          a -> b with a's result reference as b's argument, resolved by the caller
  ray actor pull     b asks a itself (a consumer pulling from its producer)
  compiled graph     a -> b as a Ray compiled graph (fixed path, shared-memory channels)
  unix socket        a length-prefixed pickle request/response on a Unix socket to another process
Run: python benchmarks/bench_transports.py [--calls 500] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import multiprocessing
import os
import pickle
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any

import prismserve  # noqa: F401  (telemetry off)


def _serve_socket(path: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                (size,) = struct.unpack("!I", await reader.readexactly(4))
            except asyncio.IncompleteReadError:
                return
            reply = pickle.dumps(("ok", pickle.loads(await reader.readexactly(size))))
            writer.write(struct.pack("!I", len(reply)) + reply)

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, path)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


async def _timed(call: Callable[[], Any], calls: int) -> float:
    """Median ms of `call()` (awaited when it returns an awaitable), after 20 warm-up calls."""
    samples = []
    for i in range(20 + calls):
        start = time.perf_counter()
        result = call()
        if inspect.isawaitable(result):
            await result
        if i >= 20:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


async def measure(calls: int) -> dict[str, float]:
    import ray
    from ray.dag import InputNode

    @ray.remote
    class Hop:
        async def call(self, value: Any = None) -> int:
            return 1

        async def pull(self, other: Any) -> int:
            return await other.call.remote() + 1

    @ray.remote
    class SyncHop:
        def step(self, value: int) -> int:
            return value + 1

    a, b = Hop.remote(), Hop.remote()
    results = {
        "ray call": await _timed(lambda: a.call.remote(), calls),
        "ray chain a->b": await _timed(lambda: b.call.remote(a.call.remote()), calls),
        "ray actor pull b<-a": await _timed(lambda: b.pull.remote(a), calls),
    }
    first, second = SyncHop.remote(), SyncHop.remote()
    with InputNode() as value:
        graph = second.step.bind(first.step.bind(value)).experimental_compile()
    try:
        results["compiled graph a->b"] = await _timed(lambda: ray.get(graph.execute(1)), calls)
    finally:
        graph.teardown()
    results["unix socket call"] = await _socket_rtt(calls)
    return results


async def _socket_rtt(calls: int) -> float:
    path = os.path.join(tempfile.mkdtemp(), "hop.sock")
    server = multiprocessing.get_context("spawn").Process(target=_serve_socket, args=(path,), daemon=True)
    server.start()
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise RuntimeError("the socket server did not start")
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_unix_connection(path)

        async def call() -> Any:
            request = pickle.dumps(("invoke", {"request": "r", "index": 0}))
            writer.write(struct.pack("!I", len(request)) + request)
            (size,) = struct.unpack("!I", await reader.readexactly(4))
            return pickle.loads(await reader.readexactly(size))

        result = await _timed(call, calls)
        writer.close()
        return result
    finally:
        server.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    # "local": a Ray of its own, even beside another cluster started on this machine.
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        _node_ip_address="127.0.0.1",
    )
    try:
        results = asyncio.run(measure(args.calls))
    finally:
        ray.shutdown()
    print(f"{'hop (zero-work calls)':<24} {'p50 ms':>8}")
    for name, p50 in results.items():
        print(f"{name:<24} {p50:>8.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
