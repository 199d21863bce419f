"""Request types of an app from a workload, and the deployments each type touches, found by recording.

A request's type is `ChatRequest.request_type` (`image+text`, `audio+text->audio`): the names the
planner's spec and the runtime's routing use. Which unit-task deployments a type runs, and in which
order, is read from the graph record & replay makes of one request of that type (000 §3.2), so no
name is written by hand.
"""

from __future__ import annotations

import base64
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from prismserve.app import App
from prismserve.bench.payloads import audio_base64, image_url, prompt, video_url
from prismserve.bench.workloads import RequestSpec
from prismserve.errors import InvalidRequestError
from prismserve.protocol.chat import ChatRequest
from prismserve.task import TaskGraph, use_dispatcher


def chat_request(spec: RequestSpec, media: Path, variant: int = 0) -> ChatRequest:
    """The chat request for a workload entry, with the shared workload media (as `prismserve bench`
    sends); its text starts at the `variant`-th word (`payloads.prompt`)."""
    root = str(media)
    return ChatRequest.of(
        prompt(spec.text_tokens, variant),
        images=[_data(image_url(root, size)) for size in spec.images],
        audios=[base64.b64decode(audio_base64(root))] * spec.audios,
        videos=[_data(video_url(root))] * spec.videos,
        audio_out=spec.audio_out,
        max_tokens=spec.output_tokens,
    )


def profile_requests(specs: list[RequestSpec], media: Path, count: int) -> dict[str, list[ChatRequest]]:
    """`count` chat requests of each type of `specs`: its first requests (again if it has fewer), each
    asking for the type's mean output tokens, their texts starting at different words of the
    prompt's cycle (so that no engine's prefix cache serves one from another, for as many requests
    as the cycle has words: 17).

    The profile times rounds of these requests started together. With the workload's own outputs a
    continuous batcher's batch is full only until the round's shortest request ends, and with
    heavy-tailed outputs (ServeGen's) most of the round ran at a partial batch: decoders measured
    0.43-0.66 of their rate at full batch (benchmarks/profile_round_drain.py). Served under load,
    finished requests are replaced and the batch stays full. With equal outputs the round's decodes
    end together, and its decode time per request is the mean request's at full batch (a decode's
    cost grows linearly with its tokens). The inputs stay the workload's: an image's cost is not
    linear in its size (InternVL's tiles), so no mean image stands for the mix."""
    by_type: dict[str, list[RequestSpec]] = defaultdict(list)
    for spec in specs:
        by_type[spec.request_type].append(spec)
    requests = {}
    for name, group in by_type.items():
        output = max(1, round(sum(s.output_tokens for s in group) / len(group)))
        chosen = [replace(group[i % len(group)], output_tokens=output) for i in range(count)]
        requests[name] = [chat_request(spec, media, variant) for variant, spec in enumerate(chosen)]
    return requests


def _data(url: str) -> bytes:
    return base64.b64decode(url.split(",", 1)[1])


def servable(app: App, specs: list[RequestSpec]) -> list[RequestSpec]:
    """The workload's requests the app takes (its input and output modalities); an error if none."""
    inputs, outputs = app.config.input_modalities, app.config.output_modalities
    kept = [
        s
        for s in specs
        if (not s.images or "image" in inputs)
        and (not s.audios or "audio" in inputs)
        and (not s.videos or "video" in inputs)
        and (not s.audio_out or "audio" in outputs)
    ]
    if not kept:
        raise InvalidRequestError(
            f"app {app.name!r} takes none of the workload's requests (it takes {sorted(inputs)} in, "
            f"{sorted(outputs)} out): choose a workload of those modalities"
        )
    return kept


def shares(specs: list[RequestSpec]) -> dict[str, float]:
    """Each request type's share of the workload."""
    counts = Counter(s.request_type for s in specs)
    return {t: n / len(specs) for t, n in sorted(counts.items())}


class _Recorded(Exception):
    """Raised by the recording dispatcher once it holds the graph of the app's first task call."""

    def __init__(self, graph: TaskGraph) -> None:
        super().__init__("recorded")
        self.graph = graph


class _Recorder:
    """A dispatcher that runs nothing: it keeps the first graph and stops serve() there."""

    async def execute(self, graph: TaskGraph) -> list[Any]:
        raise _Recorded(graph)


async def deployments_of(app: App, request: ChatRequest) -> list[str]:
    """The app's deployments (paths, as `prismserve check` prints them) that serve() invokes for
    `request` in its first task call, in call order. Needs no replica: nothing runs."""
    paths = {task.deployment_key(): path for path, task in app.named_unit_tasks().items()}
    try:
        with use_dispatcher(_Recorder()):
            result = await app.serve(request)
            if app.streaming:
                async for _ in result:  # type: ignore[union-attr]
                    break
    except _Recorded as recorded:
        found: list[str] = []
        for node in recorded.graph.nodes:
            path = paths[node.task_key]
            if path not in found:
                found.append(path)
        return found
    raise InvalidRequestError(
        f"app {app.name!r} answered a {request.request_type} request without calling a task: nothing to profile"
    )


def model_order(sequences: list[list[str]]) -> list[str]:
    """One order of every deployment that keeps each type's call order where the types agree (a
    topological order of their consecutive pairs), else the order of first appearance."""
    seen: list[str] = []
    for sequence in sequences:
        seen += [d for d in sequence if d not in seen]
    after: dict[str, set[str]] = {d: set() for d in seen}
    for sequence in sequences:
        for a, b in zip(sequence, sequence[1:], strict=False):
            after[b].add(a)
    order: list[str] = []
    while len(order) < len(seen):
        ready = [d for d in seen if d not in order and after[d] <= set(order)]
        if not ready:  # the types disagree on an order: keep the first one seen
            return seen
        order.append(ready[0])
    return order
