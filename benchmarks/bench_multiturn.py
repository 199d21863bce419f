"""Multi-turn conversations: the second turn's time to first token against the first's, with the
encoders' output cache (`encoder_cache_mib`, the default) and without it (0), in the same run.

The tiny Qwen2.5-VL's default app (the image encoder fissioned; its LLM on `--engine`) is served
twice by one in-process gateway, as `cached` and `uncached` (the same LLM deployment, an encoder
each): on transformers in this process, on vLLM on the Ray runtime (4 declared GPUs). Each
conversation sends two photos (the demo's, 1280 x 690, a pixel changed per photo so that no first
turn finds another's output) with a question, then a second turn: the whole history (the photos
again, the answer) and a follow-up. Conversations run one at a time, alternating between the apps;
the script prints the median TTFT of each turn per app, the second turn's over the first's, and the
cached app's second turn over the uncached app's.
The transformers engine recomputes the history's prompt on every turn; vLLM's prefix caching (on
for the vLLM LLM stages) finds the part it has seen, so on vLLM both caches count.
Run: python benchmarks/bench_multiturn.py [--engine transformers|vllm] [--conversations 8] [--out result.json]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import socket
import statistics
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx

import prismserve  # noqa: F401  (telemetry off)
from prismserve.app.settings import app_module_source
from prismserve.apps.settings import MLLMAppSettings
from prismserve.bench.workloads import workloads_dir
from prismserve.gateway import create_gateway
from prismserve.models import tiny
from prismserve.runtime import LocalRuntime

TOKEN = "bench-multiturn"
QUESTION, FOLLOW_UP = "What is in this photo?", "And what colours are they?"


@contextlib.contextmanager
def gateway(model: str, engine: str) -> Iterator[str]:
    """A gateway in this process serving the tiny VL's app as `cached` and `uncached`, its LLM on
    `engine` (vLLM: on a Ray runtime of declared GPUs, started and stopped with the server)."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if engine == "vllm":
        from prismserve.runtime.ray_runtime import RayRuntime

        runtime: Any = RayRuntime(fake_gpus=4)

        @contextlib.asynccontextmanager
        async def lifespan(_: Any) -> AsyncIterator[None]:
            await runtime.start()
            try:
                yield
            finally:
                await runtime.close()

        app = create_gateway(runtime, admin_token=TOKEN, max_request_bytes=32 << 20, lifespan=lifespan)
    else:
        app = create_gateway(LocalRuntime(), admin_token=TOKEN, max_request_bytes=32 << 20)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    try:
        for name, cache in (("cached", 256), ("uncached", 0)):
            vllm = {"dtype": "float32"} if engine == "vllm" else {}
            settings = MLLMAppSettings(model=model, encoder_cache_mib=cache, engine=engine, vllm=vllm)
            source = app_module_source("prismserve.apps.mllm", settings, doc=f"bench_multiturn: {name}")
            headers = {"Authorization": f"Bearer {TOKEN}"}
            registered = httpx.post(
                f"{url}/admin/apps", json={"name": name, "source": source}, headers=headers, timeout=900
            )
            registered.raise_for_status()
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def photo(variant: int) -> str:
    """The demo photo with one pixel changed, as a data URL."""
    from PIL import Image

    image = Image.open(workloads_dir() / "media" / "cars.jpg").convert("RGB")
    image.putpixel((0, 0), (variant % 256, variant // 256 % 256, 7))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def ask(client: httpx.Client, app: str, messages: list[dict]) -> tuple[float, str]:
    """(TTFT, the answer's text) of one streamed request."""
    body = {"model": app, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    started, first, text = time.perf_counter(), None, []
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0]["delta"].get("content"):
                first = first or time.perf_counter()
                text.append(delta[0]["delta"]["content"])
    return (first or time.perf_counter()) - started, "".join(text)


def conversation(client: httpx.Client, app: str, variant: int) -> tuple[float, float]:
    """(first turn's TTFT, second turn's)."""
    photos = [{"type": "image_url", "image_url": {"url": photo(variant + offset)}} for offset in (0, 50_000)]
    user = {"role": "user", "content": [*photos, {"type": "text", "text": QUESTION}]}
    first, answer = ask(client, app, [user])
    history = [user, {"role": "assistant", "content": answer}, {"role": "user", "content": FOLLOW_UP}]
    second, _ = ask(client, app, history)
    return first, second


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--conversations", type=int, default=8, help="per app")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model = str(tiny.build("qwen2.5-vl"))
    times: dict[str, list[tuple[float, float]]] = {"cached": [], "uncached": []}
    with gateway(model, args.engine) as url, httpx.Client(base_url=url, timeout=300) as client:
        conversation(client, "cached", 10_000)  # warm-up: both apps' replicas loaded
        conversation(client, "uncached", 10_001)
        for index in range(args.conversations):
            for app in ("cached", "uncached"):
                times[app].append(conversation(client, app, 2 * index + (app == "uncached")))
    report: dict[str, Any] = {"engine": args.engine}
    for app, pairs in times.items():
        first, second = (statistics.median(t[i] for t in pairs) for i in (0, 1))
        report[app] = {
            "first_turn_ttft_s": first,
            "second_turn_ttft_s": second,
            "second_over_first": second / first,
        }
        print(
            f"{app:>9}: TTFT turn 1 {first * 1000:.0f} ms, turn 2 {second * 1000:.0f} ms (turn 2 / turn 1 {second / first:.2f})"
        )
    ratio = report["cached"]["second_turn_ttft_s"] / report["uncached"]["second_turn_ttft_s"]
    report["cached_over_uncached_second_turn"] = {"ratio": ratio}
    print(f"second turn, cached / uncached: {ratio:.2f} (medians of {args.conversations} conversations each)")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
