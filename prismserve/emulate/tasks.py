"""The tasks of an emulated model: one unit task per deployment option, and the composite that routes requests.

`EmulatedTask.invoke` works out a chat request's components and their work (its cost model), picks
a path with the plan's probabilities (request-static routing, 000 §5.3; `planned_choice`) and
invokes each option's unit task on it with the work of its role; its `sim` executor waits that
long (scaled by its profile), serving later hops of a path first.
"""

from __future__ import annotations

import io
from typing import Any

from pydantic import Field, InstanceOf

from prismserve.bench.workloads import RequestSpec
from prismserve.emulate.model import EmulatedModel
from prismserve.protocol.chat import ChatCompletion, ChatRequest
from prismserve.task import DataHandle, Task, TaskInput, TaskOutput, UnitTask, replayable_choice
from prismserve.task.context import current_request
from prismserve.task.routing import planned_choice


class StageInput(TaskInput):
    """One option's share of a request: its work (A100-seconds, the sim waits for it) and the previous hop's output."""

    sim_work: float = Field(ge=0)
    previous: DataHandle[Any] | None = None
    # The hop's place on its path: a replica serves requests further along first (work in progress
    # first), so that a request that has used an upstream option is not queued behind new ones.
    sim_priority: int = Field(default=0, ge=0)


class StageOutput(TaskOutput):
    """What a hop hands to the next (embeddings, hidden states): a payload of the profile's size."""

    payload: DataHandle[Any]


class Stage(UnitTask[StageInput, StageOutput]):
    """A deployment option of an emulated model (1 GPU), served by a `sim` executor."""

    executor_kind = "sim"
    model: str
    option: str
    components: tuple[str, ...]


class Stage2(Stage):
    """An option on 2 GPUs (tensor parallel)."""

    default_gpus = 2


class Stage4(Stage):
    """An option on 4 GPUs."""

    default_gpus = 4


STAGES = {1: Stage, 2: Stage2, 4: Stage4}


def request_spec(request: ChatRequest) -> RequestSpec:
    """The size of a chat request as the cost models read it: words, image sizes, clips, output tokens."""
    from PIL import Image

    sizes = []
    for image in request.images:
        with Image.open(io.BytesIO(image.data)) as opened:  # reads the header only
            sizes.append(opened.size)
    words = sum(len(m.text.split()) for m in request.messages)
    return RequestSpec(
        arrival_s=0.0,
        text_tokens=max(1, words),
        output_tokens=output_tokens(request),
        images=tuple(sizes),
        audios=len(request.audios),
        videos=len(request.videos),
        audio_out=request.wants_audio,
    )


class EmulatedTask(Task[ChatRequest, StageOutput]):
    """An emulated model served along planned paths; `executors` maps option names to their unit tasks.

    Path probabilities come from the plan deployed for the app (`RequestContext.routing`), else `routing`.
    """

    spec: InstanceOf[EmulatedModel]
    routing: dict[str, dict[str, float]] = Field(default_factory=dict)

    def post_init(self) -> None:
        # Named for the `sim` executors that serve them, and kept so: every deployment path
        # (`model.executors.<option>`) has the name, and saved plans and profiles use those paths.
        self.executors = {
            o.name: STAGES[o.gpus](model=self.spec.name, option=o.name, components=o.components)
            for o in self.spec.options
        }
        self._paths: dict[tuple[str, ...], dict[str, list[tuple[str, tuple[str, ...]]]]] = {}

    def invoke(self, request: ChatRequest) -> StageOutput:
        spec = request_spec(request)
        work = self.spec.costs.work(spec)
        needs = self.spec.costs.needs(spec)
        paths = self._paths.get(needs) or self._paths.setdefault(needs, self.spec.paths(needs))
        names = sorted(paths)
        planned = (current_request().routing or self.routing).get(request.request_type)
        # A type the plan does not route is spread over all its paths.
        weights = (
            [planned.get(n, 0.0) for n in names] if planned and any(planned.get(n) for n in names) else None
        )
        # The plan's split realised evenly (smooth weighted round-robin), not by independent draws.
        # With path-level routing (`serve --routing path`) the least loaded of the plan's paths
        # instead: each hop a call of its role's work on its option's deployment.
        hops = [
            [
                (self.executors[o].deployment_key(), self.spec.option(o).seconds(work, role))
                for o, role in paths[n]
            ]
            for n in names
        ]
        index = (
            replayable_choice(len(names))
            if weights is None
            else planned_choice((self.spec.name, request.request_type, needs), weights, hops)
        )
        output: StageOutput | None = None
        for hop, (name, role) in enumerate(paths[names[index]]):
            seconds = self.spec.option(name).seconds(work, role)
            output = self.executors[name].invoke(
                StageInput(sim_work=seconds, previous=output.payload if output else None, sim_priority=hop)
            )
        assert output is not None  # every path has a hop
        return output


def completion(request: ChatRequest) -> ChatCompletion:
    """The answer an emulated model gives: `max_tokens` words, and silence when audio is asked for."""
    audio = bytes(2 * 2400) if request.wants_audio else None  # 0.1 s of 16-bit PCM at 24 kHz
    count = output_tokens(request)
    # The token count travels with the answer, so the gateway's usage (and a recorded trace) has it.
    return ChatCompletion(text=" ".join(["token"] * count), audio=audio, tokens=count)


# What an emulated model generates when a request leaves max_tokens unset (it has no end token).
DEFAULT_OUTPUT_TOKENS = 256


def output_tokens(request: ChatRequest) -> int:
    """How many tokens an emulated model generates for `request`."""
    return request.max_tokens or DEFAULT_OUTPUT_TOKENS
