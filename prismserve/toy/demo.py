"""`prismserve demo`: serve the toy Omni app in-process and show what record & replay does."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prismserve.app import AppRegistry, load_app
from prismserve.app.chat import ChatRequest
from prismserve.task import LocalDispatcher, TaskGraph, use_dispatcher
from prismserve.toy.executors import EXECUTORS

APP_PATH = Path(__file__).with_name("omni_app.py")

# Media are file names here: their bytes stand in for real images and audio.
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
        for text, images, audios, audio_out in REQUESTS:
            request = ChatRequest.of(text, [n.encode() for n in images], [n.encode() for n in audios], audio_out)
            out = "text+audio" if audio_out else "text"
            print(f"\nrequest: {text!r}, images={images}, audio={audios} -> {out}")
            text, audio = [], 0
            async for chunk in await app.serve(request):
                if chunk.text is not None:
                    text.append(chunk.text)
                else:
                    audio += 1
            graph = graphs[-1]
            print(graph.to_json(indent=2) if as_json else describe_graph(graph))
            print(f"response: text={''.join(text)!r}" + (f", {audio} audio chunks" if audio else ""))


def run_demo(as_json: bool = False) -> int:
    """Run the demo; returns the process exit code."""
    asyncio.run(_serve_all(as_json))
    return 0
