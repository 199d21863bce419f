"""A cluster of vLLM engines and image encoders in virtual time: ModServe (003) against a monolith.

Every LLM instance is an `EngineCore` (vLLM's step loop: chunked prefill, continuous batching, KV
capacity; `prismserve.executors.sim_engine`), so the one engine model serves the real-time `sim`
executors and this simulator. Encoder instances batch images up to `EncoderCosts.max_batch`; an
image takes `batch_s` + `s_per_token` per token, divided by `tp_speedup` of the instance's GPUs
(encoders scale poorly with tensor parallelism: 003 Figure 9).

The systems (`Cluster`):

- monolith (`encoders == 0`): vLLM with the encoder inside the engine. A request's images are
  encoded, on the instance's GPUs, inside the step its prompt starts in (vLLM's behaviour), holding
  up every request batched in that step. Requests go to the instance with the fewest in flight.
- decoupled: image instances and text instances; a request's images are one encoder job; requests
  go to the encoder / LLM with the fewest in flight; queues are FIFO.
- `slo_scheduling`: encoder and LLM queues take the least slack to the request's TTFT deadline
  first (003 §4.3 "Instance Request Scheduling").
- `token_routing`: encoders picked by the fewest pending image tokens, LLMs by the fewest pending
  prompt tokens (003 §4.3 "Request Routing").
- `fan_out`: each image its own encoder job (image-level parallelism, 003 Insight 2).
- Text-only requests never visit an encoder (modality-aware routing).
- `prefill` (PD disaggregation, 003 §5.4): the LLM instances only prefill; the KV cache then takes
  `kv_transfer_s` + `kv_transfer_s_per_token` per token to reach a decode instance.

Autoscaling (`StageScaling`): every `interval_s` each stage gets ceil(work per second over the last
`window_s` / `target_utilization`) instances (003 §4.2: the stage's load over its capacity within
the SLO); a removed instance finishes what it holds and its GPUs count until it is empty. GPU-seconds
are integrated exactly over virtual time (GPUs held x the time between events).

Events at the same instant run arrivals and finished work first, then step completions, then the
start of new steps, so a request that arrives as a step ends joins the next step, as in `simulate`.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from prismserve.executors.sim_engine import EngineCore, SimRequest, StepCosts

# Decoding requests per step the autoscaler assumes when it counts a request's decode work.
DECODE_BATCH = 16

# Event priorities at one instant (lower first): see the module docstring.
_ARRIVE, _DONE, _STEP, _KICK, _SCALE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class EncoderCosts:
    """An image encoder instance: seconds per image token and per batch on one GPU, its batch cap,
    and its speed-up on g GPUs (`tp_speedup[g]`, 1 for g not listed)."""

    s_per_token: float
    batch_s: float = 0.0
    max_batch: int = 8
    tp_speedup: dict[int, float] = field(default_factory=dict)

    def speed(self, gpus: int) -> float:
        return self.tp_speedup.get(gpus, 1.0)

    def seconds(self, tokens: int, gpus: int = 1) -> float:
        """Seconds for one call (a batch) of images of `tokens` tokens in all on `gpus` GPUs."""
        return (self.batch_s + self.s_per_token * tokens) / self.speed(gpus)


@dataclass
class Request:
    """One request: its prompt as the LLM sees it, its images' tokens, what it produces.

    `llm_tokens`: the prompt tokens the LLM prefills (DecOnly: text + image; CroAttn: text).
    `llm_extra_s`: seconds of LLM work beyond those tokens, run in its first step (CroAttn: the
    cross-attention layers' projections of the image tokens). `ttft_slo_s` sets its deadline for
    least-slack scheduling.
    """

    arrival: float
    text_tokens: int
    output_tokens: int
    image_tokens: tuple[int, ...] = ()
    llm_tokens: int = 0
    llm_extra_s: float = 0.0
    ttft_slo_s: float = math.inf
    tokens: list[float] = field(default_factory=list)  # when each output token came (virtual s)
    encoded_at: float | None = None

    @property
    def kind(self) -> str:
        return "image" if self.image_tokens else "text"

    @property
    def deadline(self) -> float:
        return self.arrival + self.ttft_slo_s

    @property
    def ttft(self) -> float:
        return self.tokens[0] - self.arrival if self.tokens else math.inf

    @property
    def tbt(self) -> float:
        """Mean time between its tokens (0 for one token)."""
        if len(self.tokens) < 2:
            return 0.0 if self.tokens else math.inf
        return (self.tokens[-1] - self.tokens[0]) / (len(self.tokens) - 1)


@dataclass(frozen=True)
class StageScaling:
    """Per-stage autoscaling: replicas = ceil(work seconds per second / target_utilization)."""

    interval_s: float = 60.0
    window_s: float = 120.0
    target_utilization: float = 0.6
    min_llms: int = 1
    min_encoders: int = 1
    max_gpus: int = 128


@dataclass(frozen=True)
class Cluster:
    """A deployment: LLM instances (`llms` on `llm_gpus` each), encoders (`encoders` on
    `encoder_gpus` each; 0: the monolith), its policies and optional PD disaggregation."""

    llm: StepCosts
    llms: int
    encoder: EncoderCosts
    encoders: int = 0
    llm_gpus: int = 4
    encoder_gpus: int = 1
    slo_scheduling: bool = False
    token_routing: bool = False
    fan_out: bool = False
    decode: StepCosts | None = None  # PD: decode instances' costs (the `llms` then only prefill)
    decodes: int = 0
    decode_gpus: int = 4
    kv_transfer_s: float = 0.0
    kv_transfer_s_per_token: float = 0.0
    autoscale: StageScaling | None = None

    @property
    def monolith(self) -> bool:
        return self.encoders == 0

    @property
    def gpus(self) -> int:
        return self.llms * self.llm_gpus + self.encoders * self.encoder_gpus + self.decodes * self.decode_gpus


class _Instance:
    """What every instance shares: its GPUs, whether it takes new work, what it holds."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.active = True
        self.in_flight = 0  # requests (or jobs) it holds
        self.pending_tokens = 0  # their tokens still to compute
        self.working = False

    @property
    def empty(self) -> bool:
        return self.in_flight == 0 and not self.working


class _LLM(_Instance):
    def __init__(self, costs: StepCosts, gpus: int) -> None:
        super().__init__(gpus)
        self.core = EngineCore(costs)
        self.kicked = False


@dataclass(eq=False)
class _Job:
    """Images of one request for one encoder call."""

    request: Request
    tokens: int
    images: int


class _Encoder(_Instance):
    def __init__(self, gpus: int) -> None:
        super().__init__(gpus)
        self.queue: list[_Job] = []


_E = TypeVar("_E", bound=_Instance)


class Simulation:
    """One run of a `Cluster` over a list of requests (see the module docstring)."""

    def __init__(self, cluster: Cluster, requests: Sequence[Request]) -> None:
        self.cluster = cluster
        self.requests = list(requests)
        self.now = 0.0
        self._events: list[tuple[float, int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.llms = [_LLM(cluster.llm, cluster.llm_gpus) for _ in range(cluster.llms)]
        self.encoders = [_Encoder(cluster.encoder_gpus) for _ in range(cluster.encoders)]
        decode = cluster.decode
        self.decodes = [_LLM(decode, cluster.decode_gpus) for _ in range(cluster.decodes)] if decode else []
        self._images_left: dict[int, int] = {}
        self.gpu_s = 0.0
        self._last = 0.0
        self.gpu_timeline: list[tuple[float, dict[str, int]]] = []  # (time, GPUs per stage) at changes
        self._work: list[tuple[float, float, float]] = []  # (arrival, encoder s, llm s) for autoscaling

    # --- the event loop -------------------------------------------------------------------------

    def _at(self, time: float, priority: int, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (time, priority, next(self._seq), action))

    def run(self) -> list[Request]:
        """Serve every request; they come back with their token times filled in."""
        for request in self.requests:
            self._at(request.arrival, _ARRIVE, functools.partial(self._arrive, request))
        if self.cluster.autoscale is not None:
            self._at(0.0, _SCALE, self._scale)
        self._record_gpus()
        scaling = self.cluster.autoscale is not None
        while self._events:
            time, _, _, action = heapq.heappop(self._events)
            if scaling and time > self._last:  # a static cluster holds all its GPUs throughout
                self.gpu_s += self._held() * (time - self._last)
            self._last = self.now = time
            action()
            if scaling and self._done():
                break
        if not scaling:
            self.gpu_s = self.cluster.gpus * self.now
        return self.requests

    def _done(self) -> bool:
        return all(len(r.tokens) >= r.output_tokens for r in self.requests)

    def _held(self) -> int:
        """GPUs held now: active instances, and removed ones still finishing their work."""
        return sum(i.gpus for i in self._instances() if i.active or not i.empty)

    def _instances(self) -> list[_Instance]:
        return [*self.llms, *self.encoders, *self.decodes]

    # --- requests -------------------------------------------------------------------------------

    def _arrive(self, request: Request) -> None:
        self._work.append((request.arrival, *self._work_of(request)))
        if not request.image_tokens or self.cluster.monolith:
            self._to_llm(request)
            return
        if self.cluster.fan_out:
            jobs = [_Job(request, tokens, 1) for tokens in request.image_tokens]
        else:
            jobs = [_Job(request, sum(request.image_tokens), len(request.image_tokens))]
        self._images_left[id(request)] = len(jobs)
        for job in jobs:
            self._to_encoder(job)

    def _work_of(self, request: Request) -> tuple[float, float]:
        """Seconds of encoder and LLM work `request` brings (batch 1, one instance): the load the
        autoscaler measures. The monolith's encoding counts as LLM work (it runs there)."""
        cluster, costs = self.cluster, self.cluster.llm
        tokens = sum(request.image_tokens)
        encode = cluster.encoder.seconds(tokens, cluster.encoder_gpus) if tokens else 0.0
        llm = request.llm_tokens * costs.prefill_token_s + costs.prefill_seq_s + request.llm_extra_s
        llm += request.output_tokens * (costs.decode_seq_s + costs.step_s / DECODE_BATCH)
        if cluster.monolith:
            return 0.0, llm + (cluster.encoder.seconds(tokens, cluster.llm_gpus) if tokens else 0.0)
        return (encode if request.image_tokens else 0.0), llm

    def _pick(self, pool: Sequence[_Instance], tokens: bool) -> _Instance:
        active = [i for i in pool if i.active]
        if not active:
            raise RuntimeError("no active instance in a pool: give every stage at least one")
        return min(active, key=lambda i: i.pending_tokens if tokens else i.in_flight)

    def _slack_key(self, request: Request, seconds: float) -> tuple[float, float]:
        return (request.deadline - seconds, request.arrival)

    # --- encoders -------------------------------------------------------------------------------

    def _to_encoder(self, job: _Job) -> None:
        encoder = self._pick(self.encoders, self.cluster.token_routing)
        assert isinstance(encoder, _Encoder)
        encoder.queue.append(job)
        encoder.in_flight += 1
        encoder.pending_tokens += job.tokens
        if not encoder.working:
            self._at(self.now, _KICK, lambda: self._encode(encoder))

    def _encode(self, encoder: _Encoder) -> None:
        if encoder.working or not encoder.queue:
            return
        costs, gpus = self.cluster.encoder, self.cluster.encoder_gpus
        if self.cluster.slo_scheduling:
            encoder.queue.sort(key=lambda j: self._slack_key(j.request, costs.seconds(j.tokens, gpus)))
        batch = encoder.queue[: costs.max_batch]
        del encoder.queue[: costs.max_batch]
        seconds = costs.seconds(sum(job.tokens for job in batch), gpus)
        encoder.working = True
        self._at(self.now + seconds, _DONE, lambda: self._encoded(encoder, batch))

    def _encoded(self, encoder: _Encoder, batch: list[_Job]) -> None:
        encoder.working = False
        encoder.in_flight -= len(batch)
        encoder.pending_tokens -= sum(job.tokens for job in batch)
        for job in batch:
            key = id(job.request)
            self._images_left[key] -= 1
            if self._images_left[key] == 0:
                del self._images_left[key]
                job.request.encoded_at = self.now
                self._to_llm(job.request)
        self._encode(encoder)

    # --- LLMs -----------------------------------------------------------------------------------

    def _to_llm(self, request: Request) -> None:
        llm = self._pick(self.llms, self.cluster.token_routing)
        assert isinstance(llm, _LLM)
        extra = request.llm_extra_s
        if self.cluster.monolith and request.image_tokens:
            tokens = sum(request.image_tokens)
            extra += self.cluster.encoder.seconds(tokens, self.cluster.llm_gpus)
        out = 1 if self.decodes else request.output_tokens
        sim = SimRequest(prompt_tokens=request.llm_tokens, output_tokens=out, encode_s=extra, tag=request)
        self._add(llm, sim, request.llm_tokens)

    def _add(self, llm: _LLM, sim: SimRequest, tokens: int) -> None:
        llm.core.add(sim)
        llm.in_flight += 1
        llm.pending_tokens += tokens
        if self.cluster.slo_scheduling:
            costs = llm.core.costs
            llm.core.waiting = type(llm.core.waiting)(
                sorted(
                    llm.core.waiting,
                    key=lambda s: self._slack_key(_owner(s), s.prompt_tokens * costs.prefill_token_s),
                )
            )
        if not llm.working and not llm.kicked:
            llm.kicked = True
            self._at(self.now, _KICK, lambda: self._step(llm))

    def _step(self, llm: _LLM) -> None:
        llm.kicked = False
        if llm.working or not llm.core.busy:
            return
        step = llm.core.step()
        if not step.produced and step.seconds == 0:
            raise RuntimeError("an LLM instance cannot schedule anything: its KV cache is too small")
        llm.working = True
        self._at(self.now + step.seconds, _STEP, lambda: self._stepped(llm, step.produced, step.finished))

    def _stepped(self, llm: _LLM, produced: list[SimRequest], finished: list[SimRequest]) -> None:
        llm.working = False
        is_decode = llm in self.decodes
        for sim in produced:
            request = _owner(sim)
            if sim.produced == 1 and not is_decode:
                llm.pending_tokens -= sim.prompt_tokens
            request.tokens.append(self.now)
        for sim in finished:
            llm.in_flight -= 1
            request = _owner(sim)
            if self.decodes and not is_decode and request.output_tokens > 1:
                self._hand_off(request)
        if llm.core.busy:
            self._step(llm)

    def _hand_off(self, request: Request) -> None:
        """PD: the prompt's KV cache travels to the decode instance with the fewest in flight."""
        cluster = self.cluster
        seconds = cluster.kv_transfer_s + cluster.kv_transfer_s_per_token * request.llm_tokens
        decode = self._pick(self.decodes, False)
        assert isinstance(decode, _LLM)
        sim = SimRequest(
            prompt_tokens=request.llm_tokens, output_tokens=request.output_tokens, tag=request, produced=1
        )
        sim.computed = request.llm_tokens  # its KV arrived: only decodes remain
        sim.encoded = True
        self._at(self.now + seconds, _DONE, lambda: self._add(decode, sim, 0))

    # --- autoscaling ----------------------------------------------------------------------------

    def _scale(self) -> None:
        scale = self.cluster.autoscale
        assert scale is not None
        if self.now == 0.0:  # the initial sizing from history (003 §4.2): the first window's work
            recent = [(r.arrival, *self._work_of(r)) for r in self.requests if r.arrival < scale.window_s]
            span = scale.window_s
        else:
            recent = [w for w in self._work if w[0] > self.now - scale.window_s]
            span = min(scale.window_s, self.now)
        encode_rate = sum(w[1] for w in recent) / span
        llm_rate = sum(w[2] for w in recent) / span
        want_encoders = _want(encode_rate, scale, scale.min_encoders) if self.encoders else 0
        want_llms = _want(llm_rate, scale, scale.min_llms)
        cluster = self.cluster
        total = want_encoders * cluster.encoder_gpus + want_llms * cluster.llm_gpus
        if total > scale.max_gpus:  # over the cluster: both stages shrink in proportion
            factor = scale.max_gpus / total
            want_llms = max(scale.min_llms, int(want_llms * factor))
            if self.encoders:
                want_encoders = max(scale.min_encoders, int(want_encoders * factor))
        _resize(self.encoders, want_encoders, lambda: _Encoder(cluster.encoder_gpus))
        _resize(self.llms, want_llms, lambda: _LLM(cluster.llm, cluster.llm_gpus))
        self._record_gpus()
        if not self._done():
            self._at(self.now + scale.interval_s, _SCALE, self._scale)

    def _record_gpus(self) -> None:
        stages: dict[str, Sequence[_Instance]] = {
            "llm": self.llms,
            "encoder": self.encoders,
            "decode": self.decodes,
        }
        self.gpu_timeline.append(
            (self.now, {name: sum(i.gpus for i in pool if i.active) for name, pool in stages.items()})
        )


def _resize(pool: list[_E], want: int, new: Callable[[], _E]) -> None:
    """Keep `want` instances of `pool` active: the newest ones drain first, idle ones come back."""
    active = [i for i in pool if i.active]
    for instance in active[want:]:
        instance.active = False  # it finishes what it holds; new work goes elsewhere
    for _ in range(want - len(active)):
        idle = next((i for i in pool if not i.active), None)
        if idle is not None:
            idle.active = True
        else:
            pool.append(new())


def _want(rate: float, scale: StageScaling, minimum: int) -> int:
    return max(minimum, math.ceil(rate / scale.target_utilization))


def _owner(sim: SimRequest) -> Request:
    assert isinstance(sim.tag, Request)
    return sim.tag


def simulate_cluster(cluster: Cluster, requests: Sequence[Request]) -> Simulation:
    """Run `cluster` over `requests` (fresh copies are not made: pass new `Request`s each run)."""
    simulation = Simulation(cluster, requests)
    simulation.run()
    return simulation
