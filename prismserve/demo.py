"""`prismserve demo`: a tiny random-weight Qwen2.5-Omni, built offline, served end to end.

- default: the real server in this process — the Ray runtime on declared GPUs, one replica per
  component (image encoder, audio encoder, thinker, talker, vocoder), the gateway on 127.0.0.1 — the
  app registered through the admin API and asked three chat questions through `/v1/chat/completions`
  (text; an image; a spoken question answered with text and speech);
- `--in-process`: the same model with record & replay in this process only: no Ray, no HTTP.
Each request's recorded task graph is printed with its response. The weights are random, so the
answers are gibberish; every component runs for real. The model is built locally, so the demo runs
in hub offline mode (its replicas too).
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import secrets
import socket
import struct
import wave
from typing import Any

from pydantic import BaseModel

from prismserve.app import AppRegistry, load_app_source
from prismserve.apps import demo_app_source
from prismserve.offline import go_offline
from prismserve.protocol.chat import ChatChunk, ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import TaskGraph, use_dispatcher


def describe_graph(graph: TaskGraph) -> str:
    """A readable table of a recorded graph: one line per unit-task invocation."""
    lines = [f"recorded graph of {graph.root}: {len(graph)} unit-task invocations"]
    for node in graph:
        inputs = ", ".join(f"{data} from #{src}" for data, src in node.deps.items()) or "request only"
        lines.append(
            f"  #{node.index} {type(node.task).__name__:<12} executor={node.executor_kind:<10} inputs: {inputs}"
        )
    return "\n".join(lines)


def media() -> tuple[bytes, bytes, str]:
    """An image and a spoken question: the shared workloads' files when present, else generated."""
    from prismserve.bench.workloads import WorkloadError, workloads_dir

    try:
        folder = workloads_dir() / "media"
        return (folder / "cars.jpg").read_bytes(), (folder / "query_to_cars.wav").read_bytes(), str(folder)
    except (WorkloadError, OSError):
        return _png(), _wav(), "generated"


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (96, 64), (40, 120, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def _wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    samples = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
        for i in range(int(seconds * rate))
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples)
    return buffer.getvalue()


def chat_bodies(image: bytes, audio: bytes) -> list[dict[str, Any]]:
    """The demo's three OpenAI chat requests."""
    image_url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    spoken = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"},
    }
    return [
        {"messages": [{"role": "user", "content": "What is prismserve?"}], "max_tokens": 12},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": image_url}},
                        {"type": "text", "text": "What is in the picture?"},
                    ],
                }
            ],
            "max_tokens": 12,
        },
        {
            "modalities": ["text", "audio"],
            "messages": [{"role": "user", "content": [spoken, {"type": "text", "text": "Answer aloud."}]}],
            "max_tokens": 12,
        },
    ]


def _tiny_model() -> str:
    from prismserve.models import tiny

    path = str(tiny.build("qwen2.5-omni"))
    print(f"tiny Qwen2.5-Omni (random weights) at {path}")
    return path


async def _in_process(as_json: bool) -> None:
    from prismserve.gateway.openai_api import to_chat_request
    from prismserve.protocol.openai import OpenAIChatRequest

    registry = AppRegistry()
    app = load_app_source(demo_app_source(_tiny_model()), "omni", "<demo app>")
    registry.register(app)
    print(f"app {app.name!r}: request {app.request_model.__name__}, streams {app.response_model.__name__}")
    print(f"deployments: {len(registry.deployments)}")
    for key in registry.deployments:
        print(f"  {key}")
    graphs: list[TaskGraph] = []
    dispatcher = LocalDispatcher(on_graph=graphs.append)  # every unit task on its real executor
    image, audio, source = media()
    print(f"media from {source}")
    with use_dispatcher(dispatcher):
        for body in chat_bodies(image, audio):
            request: ChatRequest = await to_chat_request(
                OpenAIChatRequest.model_validate({**body, "model": "omni"}), app
            )
            print(f"\nrequest ({request.request_type})")
            text, samples = [], 0
            chunks = await app.serve(request)
            assert not isinstance(chunks, BaseModel)  # the demo app streams ChatChunks
            async for chunk in chunks:
                assert isinstance(chunk, ChatChunk)
                if chunk.text is not None:
                    text.append(chunk.text)
                if chunk.audio is not None:
                    samples += len(chunk.audio) // 2
            graph = graphs[-1]
            print(graph.to_json(indent=2) if as_json else describe_graph(graph))
            print(
                f"response: text={''.join(text)!r}"
                + (f", audio {samples} samples at 24000 Hz" if samples else "")
            )
    await dispatcher.close()


async def _server(fake_gpus: int) -> None:
    import httpx
    import uvicorn

    from prismserve.gateway import create_gateway
    from prismserve.gateway.openai_api import to_chat_request
    from prismserve.protocol.openai import OpenAIChatRequest
    from prismserve.runtime import create_runtime

    source = demo_app_source(_tiny_model())
    runtime = create_runtime(fake_gpus=fake_gpus)
    await runtime.start()
    token = secrets.token_urlsafe(16)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_gateway(runtime, admin_token=token), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    serving = asyncio.get_running_loop().create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                serving.result()
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        print(f"gateway at {url}; Ray runtime with {fake_gpus} declared GPUs, transformers executors")
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            admin = {"Authorization": f"Bearer {token}"}
            registered = await client.post(
                "/admin/apps", json={"name": "omni", "source": source}, headers=admin
            )
            registered.raise_for_status()
            print(
                f"registered app 'omni': {len(registered.json()['deployments'])} deployments, one replica each:"
            )
            status = (await client.get("/admin/status", headers=admin)).json()
            kinds = {key: d["executor_kind"] for key, d in status["deployments"].items()}
            for cell in status["cells"]:
                names = ", ".join(kinds[key] for key in cell["replicas"])
                print(f"  cell {cell['id']}: {cell['gpus']} GPU on node {cell['node_id'][:8]}: {names}")
            app = runtime.registry.get("omni")
            image, audio, where = media()
            print(f"media from {where}")
            for body in chat_bodies(image, audio):
                body["model"] = "omni"
                request = await to_chat_request(OpenAIChatRequest.model_validate(body), app)
                print(f"\nPOST /v1/chat/completions  ({request.request_type})")
                print(describe_graph(app.tasks["model"].record(request)))
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                message = response.json()["choices"][0]["message"]
                line = f"response: {message['content']!r}"
                if message.get("audio"):
                    with wave.open(io.BytesIO(base64.b64decode(message["audio"]["data"]))) as clip:
                        line += f", audio {clip.getnframes()} samples at {clip.getframerate()} Hz"
                print(line)
    finally:
        server.should_exit = True
        await serving
        await runtime.close()


def run_demo(as_json: bool = False, in_process: bool = False, fake_gpus: int = 8) -> int:
    """Run the demo; returns the process exit code. The model is built here: the hub is never needed."""
    go_offline()
    asyncio.run(_in_process(as_json) if in_process else _server(fake_gpus))
    return 0
