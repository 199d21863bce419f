"""`prismserve demo`: serve the toy Omni app in-process and show what record & replay does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from prismserve.app import AppRegistry, load_app
from prismserve.task import LocalDispatcher, TaskGraph, use_dispatcher
from prismserve.toy.executors import EXECUTORS

APP_PATH = Path(__file__).with_name("omni_app.py")

REQUESTS = [
    {"prompt": "What is prismserve?"},
    {"prompt": "Describe these two pictures", "images": ["cat.png", "dog.png"]},
    {"prompt": "Answer the question in this clip aloud", "audios": ["question.wav"], "audio_output": True},
]


def describe_graph(graph: TaskGraph) -> str:
    """A readable table of a recorded graph: one line per unit-task invocation."""
    lines = [f"recorded graph of {graph.root}: {len(graph)} unit-task invocations"]
    for node in graph:
        inputs = ", ".join(f"{data} from #{src}" for data, src in node.deps.items()) or "request only"
        lines.append(f"  #{node.index} {type(node.task).__name__:<12} executor={node.executor_kind:<8} inputs: {inputs}")
    return "\n".join(lines)


async def _serve_all(as_json: bool) -> None:
    registry = AppRegistry()
    app = load_app(APP_PATH, name="omni")
    registry.register(app)
    print(f"app {app.name!r}: request {app.request_type.__name__}, streams {app.response_type.__name__}")
    print(f"deployments (equivalent unit tasks shared): {len(registry.deployments)}")
    for key in registry.deployments:
        print(f"  {key}")
    graphs: list[TaskGraph] = []
    with use_dispatcher(LocalDispatcher(EXECUTORS, on_graph=graphs.append)):
        for body in REQUESTS:
            # Media are file names here; their bytes stand in for real images and audio.
            request = {**body, **{k: [n.encode() for n in body.get(k, [])] for k in ("images", "audios")}}
            print(f"\nrequest: {json.dumps(body)}")
            text, audio = [], 0
            async for chunk in await app.serve(request):
                if chunk.text is not None:
                    text.append(chunk.text)
                else:
                    audio += 1
            graph = graphs[-1]
            print(graph.to_json(indent=2) if as_json else describe_graph(graph))
            print(f"response: text={' '.join(text)!r}" + (f", {audio} audio chunks" if audio else ""))


def run_demo(as_json: bool = False) -> int:
    """Run the demo; returns the process exit code."""
    asyncio.run(_serve_all(as_json))
    return 0
