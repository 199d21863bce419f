"""`prismserve demo`: the toy Omni app served two ways.

- default: the real server in this process — the Ray runtime on 8 declared GPUs with `sim`
  executors, the gateway on 127.0.0.1 — registered through the admin API and asked three chat
  questions through `/v1/chat/completions`;
- `--in-process`: record & replay against fake executors, no Ray, no HTTP.
Each request's recorded task graph is printed with its response.
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
from pathlib import Path
from typing import Any

from prismserve.app import AppRegistry, load_app
from prismserve.app.chat import ChatRequest
from prismserve.task import LocalDispatcher, TaskGraph, use_dispatcher
from prismserve.toy.executors import EXECUTORS

APP_PATH = Path(__file__).with_name("omni_app.py")
MLLM_APP_PATH = Path(__file__).with_name("mllm_app.py")

# In-process requests: media are file names, their bytes stand in for real images and audio.
REQUESTS = [
    ("What is prismserve?", [], [], False),
    ("Describe these two pictures", ["cat.png", "dog.png"], [], False),
    ("Answer the question in this clip aloud", [], ["question.wav"], True),
]


def describe_graph(graph: TaskGraph) -> str:
    """A readable table of a recorded graph: one line per unit-task invocation."""
    lines = [f"recorded graph of {graph.root}: {len(graph)} unit-task invocations"]
    for node in graph:
        inputs = ", ".join(f"{data} from #{src}" for data, src in node.deps.items()) or "request only"
        lines.append(f"  #{node.index} {type(node.task).__name__:<12} executor={node.executor_kind:<8} inputs: {inputs}")
    return "\n".join(lines)


async def _in_process(as_json: bool) -> None:
    registry = AppRegistry()
    app = load_app(APP_PATH, name="omni")
    registry.register(app)
    print(f"app {app.name!r}: request {app.request_type.__name__}, streams {app.response_type.__name__}")
    print(f"deployments (equivalent unit tasks shared): {len(registry.deployments)}")
    for key in registry.deployments:
        print(f"  {key}")
    graphs: list[TaskGraph] = []
    with use_dispatcher(LocalDispatcher(EXECUTORS, on_graph=graphs.append)):
        for text, images, audios, audio_out in REQUESTS:
            request = ChatRequest.of(text, [n.encode() for n in images], [n.encode() for n in audios], audio_out)
            out = "text+audio" if audio_out else "text"
            print(f"\nrequest: {text!r}, images={images}, audio={audios} -> {out}")
            text_out, audio = [], 0
            async for chunk in await app.serve(request):
                if chunk.text is not None:
                    text_out.append(chunk.text)
                else:
                    audio += 1
            graph = graphs[-1]
            print(graph.to_json(indent=2) if as_json else describe_graph(graph))
            print(f"response: text={''.join(text_out)!r}" + (f", {audio} audio chunks" if audio else ""))


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (40, 120, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def _wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    samples = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(int(seconds * rate)))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples)
    return buffer.getvalue()


def _server_requests() -> list[dict[str, Any]]:
    image = "data:image/png;base64," + base64.b64encode(_png()).decode()
    audio = base64.b64encode(_wav()).decode()
    return [
        {"messages": [{"role": "user", "content": "What is prismserve?"}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Describe these two pictures"},
                        {"type": "image_url", "image_url": {"url": image}},
                        {"type": "image_url", "image_url": {"url": image}},
                    ],
                }
            ]
        },
        {
            "modalities": ["text", "audio"],
            "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}}]}],
        },
    ]


async def _server(fake_gpus: int) -> None:
    import httpx
    import uvicorn

    from prismserve.gateway import create_gateway
    from prismserve.gateway.openai_api import OpenAIChatRequest, to_chat_request
    from prismserve.runtime import create_runtime

    runtime = create_runtime(fake_gpus=fake_gpus)
    await runtime.start()
    token = secrets.token_urlsafe(16)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_gateway(runtime, admin_token=token), host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.get_running_loop().create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                serving.result()
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        print(f"gateway at {url}; Ray runtime with {fake_gpus} declared GPUs, sim executors")
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            admin = {"Authorization": f"Bearer {token}"}
            registered = await client.post("/admin/apps", json={"name": "omni", "source": APP_PATH.read_text()}, headers=admin)
            registered.raise_for_status()
            print(f"registered app 'omni': {len(registered.json()['deployments'])} deployments, one replica each:")
            for cell in (await client.get("/admin/status", headers=admin)).json()["cells"]:
                print(f"  cell {cell['id']}: {cell['gpus']} GPU on node {cell['node_id'][:8]}, replicas {list(cell['replicas'].values())}")
            app = runtime.registry.get("omni")
            for body in _server_requests():
                body["model"] = "omni"
                request = to_chat_request(OpenAIChatRequest.model_validate(body), app)
                kinds = request.request_type
                print(f"\nPOST /v1/chat/completions  ({kinds})")
                print(describe_graph(app.tasks["omni"].record(request)))
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
    """Run the demo; returns the process exit code."""
    asyncio.run(_in_process(as_json) if in_process else _server(fake_gpus))
    return 0
