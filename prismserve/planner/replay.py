"""Layout by trace replay (TriInfer, paper 004 Algorithm 2): a discrete-event replay of a request trace.

`replay` runs a trace on a layout of one-GPU instances (`{"EP": 6, "D": 2}`) in virtual time: each
instance iterates Algorithm 1 (`stage_batching`), requests migrate encode → prefill → decode between
instances (image cache, then KV cache), and every request's TTFT and TBTs are kept. `goodput` is the
highest per-GPU rate at which ≥ 90 % of requests meet both SLOs, by bisection on the trace's rate.
`hybrid_layout` is Algorithm 2: split N instances by the trace's encode/prefill/decode work, replay
E+P+D, EP+D and ED+P at that split, keep the best. Deterministic: no clocks, no randomness.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

from prismserve.planner.errors import PlannerError
from prismserve.planner.stage_batching import KINDS, InstanceBudgets, StageCosts, fixed_budgets, stage_budgets

ATTAINMENT = 0.9  # goodput's threshold: the share of requests meeting both SLOs (004 §2)
TBT_SHARE = 0.9  # a request meets the TBT SLO when this share of its gaps is within it (004 §2)
METHODS = ("E+P+D", "EP+D", "ED+P")
NAME_ORDER = ("E", "EP", "ED", "EPD", "P", "PD", "D")  # how the paper writes layouts: 1E+3P+4D


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it came, its prompt's text tokens, its images, its output tokens."""

    arrival_s: float
    text_tokens: int
    output_tokens: int
    images: int = 0


def read_trace(path: str | Path) -> list[TraceRequest]:
    """A trace written as JSON lines of the workload format (`arrival_s`, `text_tokens`, `output_tokens`,
    `images`: [[w, h], ...]), as `prismserve serve --record-trace` writes it."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise PlannerError(f"{path}: cannot read the trace: {exc.strerror or exc}") from None
    trace = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            trace.append(
                TraceRequest(
                    arrival_s=float(row.get("arrival_s", 0.0)),
                    text_tokens=int(row["text_tokens"]),
                    output_tokens=max(1, int(row["output_tokens"])),
                    images=len(row.get("images") or ()),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlannerError(
                f"{path}:{number}: not a trace request (needs text_tokens and output_tokens): {exc}"
            ) from None
    if not trace:
        raise PlannerError(f"{path}: the trace holds no request")
    return sorted(trace, key=lambda r: r.arrival_s)


@dataclass(eq=False)
class Job:
    """A request during the replay: its progress through the stages and the times it reached each."""

    request: TraceRequest
    arrival: float
    prompt: int  # LLM tokens to prefill (text + image tokens)
    images_left: int
    prefill_left: int
    decoded: int = 0
    over: int = 0  # TBT gaps over the SLO
    gaps: int = 0
    times: dict[str, float] = field(default_factory=dict)

    @property
    def context(self) -> int:
        """KV-cache tokens this request holds while decoding."""
        return self.prompt + self.decoded


class Instance:
    """One GPU instance running Algorithm 1: decodes first, then partial work, then new work."""

    def __init__(
        self, index: int, kind: str, budgets: InstanceBudgets, costs: StageCosts, dual_stream: bool
    ) -> None:
        self.index, self.kind, self.budgets, self.costs = index, kind, budgets, costs
        self.dual_stream = dual_stream
        self.new_encodes: deque[Job] = deque()
        self.new_prefills: deque[Job] = deque()
        self.new_decodes: deque[Job] = deque()
        self.encoding: list[Job] = []
        self.prefilling: list[Job] = []
        self.decoding: list[Job] = []
        self.kv_used = 0
        self.busy = False
        self.load = 0  # requests here (waiting or running): the router's load measure

    def has_work(self) -> bool:
        """Whether a step would do anything (a migrated decode waits while the KV cache is full)."""
        return bool(
            self.decoding or self.encoding or self.prefilling or self.new_encodes or self.new_prefills
        ) or bool(self.new_decodes and self._fits(self.new_decodes[0]))

    def _fits(self, job: Job) -> bool:
        # An empty instance takes any request, so a request larger than the cache still runs.
        return (
            self.kv_used == 0
            or self.kv_used + job.prompt + job.request.output_tokens <= self.costs.kv_capacity_tokens
        )

    def _hold(self, job: Job) -> None:
        self.kv_used += job.prompt + job.request.output_tokens

    def release(self, job: Job) -> None:
        """Frees `job`'s KV cache here (it finished or migrated away)."""
        self.kv_used -= job.prompt + job.request.output_tokens

    def batch(self, now: float) -> tuple[list[Job], list[tuple[Job, int]], list[tuple[Job, int]], float]:
        """Algorithm 1: the next batch (decodes, prefill chunks, encode items) and its seconds."""
        while self.new_decodes and self._fits(self.new_decodes[0]):
            job = self.new_decodes.popleft()
            self._hold(job)
            job.times.setdefault("decode_start", now)
            self.decoding.append(job)
        decodes = list(self.decoding)
        tokens = len(decodes)
        kv = sum(job.context for job in decodes)
        chunks: list[tuple[Job, int]] = []
        encodes: list[tuple[Job, int]] = []
        images = 0
        for job in self.prefilling:
            if tokens < self.budgets.tokens:
                chunk = min(job.prefill_left, self.budgets.tokens - tokens)
                chunks.append((job, chunk))
                tokens += chunk
        for job in self.encoding:
            if images < self.budgets.images:
                taken = min(job.images_left, self.budgets.images - images)
                encodes.append((job, taken))
                images += taken
        while tokens < self.budgets.tokens and self.new_prefills and self._fits(self.new_prefills[0]):
            job = self.new_prefills.popleft()
            self._hold(job)
            job.times["prefill_start"] = now
            self.prefilling.append(job)
            chunk = min(job.prefill_left, self.budgets.tokens - tokens)
            chunks.append((job, chunk))
            tokens += chunk
        while images < self.budgets.images and self.new_encodes:
            job = self.new_encodes.popleft()
            job.times["encode_start"] = now
            self.encoding.append(job)
            taken = min(job.images_left, self.budgets.images - images)
            encodes.append((job, taken))
            images += taken
        kv += sum(job.prompt - job.prefill_left for job, _ in chunks)
        seconds = self.costs.step_s(images, tokens, kv, self.dual_stream)
        return decodes, chunks, encodes, seconds


class Replay:
    """One replay of a trace on a layout: the event loop, routing and migrations."""

    def __init__(
        self,
        layout: dict[str, int],
        costs: StageCosts,
        stage_batching: bool = True,
        dual_stream: bool = True,
        give_up_after: int | None = None,
    ) -> None:
        check_layout(layout)
        fixed = fixed_budgets(costs)
        self.costs = costs
        self.instances = [
            Instance(i, kind, stage_budgets(kind, costs) if stage_batching else fixed, costs, dual_stream)
            for i, kind in enumerate(
                k for k, n in sorted(layout.items(), key=lambda kv: KINDS.index(kv[0])) for _ in range(n)
            )
        ]
        self.give_up_after = give_up_after  # stop once this many requests missed (the rate is too high)
        self.missed = 0
        self._events: list[tuple[float, int, str, object]] = []
        self._order = count()

    def _at(self, time: float, what: str, payload: object) -> None:
        heapq.heappush(self._events, (time, next(self._order), what, payload))

    def _least_loaded(self, stage: str) -> Instance:
        return min((i for i in self.instances if stage in i.kind), key=lambda i: (i.load, i.index))

    def run(self, trace: list[TraceRequest]) -> list[Job]:
        """Replays `trace` to the end (or until `give_up_after` misses); returns every request's job."""
        jobs = []
        for request in trace:
            prompt = request.text_tokens + request.images * self.costs.image_tokens
            job = Job(request, request.arrival_s, prompt, request.images, prompt)
            jobs.append(job)
            self._at(request.arrival_s, "arrive", job)
        while self._events:
            now, _, what, payload = heapq.heappop(self._events)
            if what == "step":
                assert isinstance(payload, tuple)
                self._finish_step(now, *payload)
            else:
                assert isinstance(payload, tuple | Job)
                self._deliver(now, what, payload)
            if self.give_up_after is not None and self.missed >= self.give_up_after:
                break
        return jobs

    def _deliver(self, now: float, what: str, payload: object) -> None:
        if what == "arrive":
            assert isinstance(payload, Job)
            job = payload
            stage = "E" if job.images_left else "P"
            instance = self._least_loaded(stage)
            instance.load += 1
            job.times["entered"] = now
            (instance.new_encodes if stage == "E" else instance.new_prefills).append(job)
        else:
            assert isinstance(payload, tuple)
            job, instance = payload
            job.times[f"{what}_ready"] = now
            instance.load += 1
            # Pull-based migration: a migrated request goes to the head of the waiting queue (004 §4.3).
            (instance.new_prefills if what == "prefill" else instance.new_decodes).appendleft(job)
        self._wake(now, instance)

    def _wake(self, now: float, instance: Instance) -> None:
        if instance.busy or not instance.has_work():
            return
        decodes, chunks, encodes, seconds = instance.batch(now)
        if not (decodes or chunks or encodes):
            return
        instance.busy = True
        self._at(now + seconds, "step", (instance, decodes, chunks, encodes))

    def _finish_step(
        self,
        now: float,
        instance: Instance,
        decodes: list[Job],
        chunks: list[tuple[Job, int]],
        encodes: list[tuple[Job, int]],
    ) -> None:
        instance.busy = False
        for job in decodes:
            self._decoded(now, instance, job)
        for job, chunk in chunks:
            job.prefill_left -= chunk
            if not job.prefill_left:
                instance.prefilling.remove(job)
                self._prefilled(now, instance, job)
        for job, taken in encodes:
            job.images_left -= taken
            if not job.images_left:
                instance.encoding.remove(job)
                self._encoded(now, instance, job)
        self._wake(now, instance)

    def _encoded(self, now: float, instance: Instance, job: Job) -> None:
        job.times["encode_end"] = now
        if "P" in instance.kind:
            job.times["prefill_ready"] = now
            instance.new_prefills.append(job)
            return
        instance.load -= 1
        target = self._least_loaded("P")
        self._at(now + self.costs.ep_migration_s(job.request.images), "prefill", (job, target))

    def _prefilled(self, now: float, instance: Instance, job: Job) -> None:
        job.times["first_token"] = job.times["last_token"] = now
        if now - job.arrival > self.costs.ttft_s:
            self._miss(job)
        if job.request.output_tokens <= 1:
            self._done(now, instance, job)
        elif "D" in instance.kind:
            job.times["decode_ready"] = now
            instance.release(job)  # held again when admitted to decode
            instance.new_decodes.appendleft(job)
        else:
            instance.release(job)
            instance.load -= 1
            target = self._least_loaded("D")
            self._at(now + self.costs.pd_migration_s(job.prompt), "decode", (job, target))

    def _decoded(self, now: float, instance: Instance, job: Job) -> None:
        job.decoded += 1
        job.gaps += 1
        if now - job.times["last_token"] > self.costs.tbt_s + 1e-12:
            job.over += 1
            if job.over == math.floor((1 - TBT_SHARE) * (job.request.output_tokens - 1)) + 1:
                self._miss(job)
        job.times["last_token"] = now
        if job.decoded >= job.request.output_tokens - 1:
            instance.decoding.remove(job)
            instance.release(job)
            self._done(now, instance, job)

    def _done(self, now: float, instance: Instance, job: Job) -> None:
        job.times["done"] = now
        instance.load -= 1
        if job.request.output_tokens <= 1:
            instance.release(job)

    def _miss(self, job: Job) -> None:
        if not job.times.get("missed"):
            job.times["missed"] = 1.0
            self.missed += 1


def met_slo(job: Job, costs: StageCosts) -> bool:
    """TTFT within its SLO and at least 90 % of the TBT gaps within theirs (004 §2)."""
    if "done" not in job.times:
        return False
    ttft = job.times["first_token"] - job.arrival
    return ttft <= costs.ttft_s and job.over <= (1 - TBT_SHARE) * job.gaps + 1e-9


def check_layout(layout: dict[str, int]) -> None:
    """A layout must name known kinds and cover encode (when it has any), prefill and decode."""
    unknown = sorted(set(layout) - set(KINDS))
    if unknown:
        raise PlannerError(f"layout: unknown instance kinds {unknown}; kinds are {', '.join(KINDS)}")
    held = {stage for kind, n in layout.items() if n > 0 for stage in kind}
    missing = sorted({"E", "P", "D"} - held)
    if missing:
        raise PlannerError(f"layout {layout_name(layout)} has no instance for stage(s) {missing}")


def layout_name(layout: dict[str, int]) -> str:
    """`3EP+5D`: counts and kinds in E, P, D order, as the paper writes them."""
    ordered = sorted((k for k, n in layout.items() if n), key=NAME_ORDER.index)
    return "+".join(f"{layout[k]}{k}" for k in ordered)


def scaled(trace: list[TraceRequest], rate: float) -> list[TraceRequest]:
    """The trace's requests arriving at mean `rate` requests/s (inter-arrival shape kept)."""
    start = trace[0].arrival_s
    span = trace[-1].arrival_s - start
    factor = (len(trace) - 1) / span / rate if span > 0 and len(trace) > 1 else 0.0
    return [
        TraceRequest((r.arrival_s - start) * factor, r.text_tokens, r.output_tokens, r.images) for r in trace
    ]


@dataclass(frozen=True)
class Attainment:
    """SLO attainment of one replay: the share meeting both SLOs, and each alone."""

    rate_per_gpu: float
    slo: float
    ttft: float
    tbt: float


def attainment(
    trace: list[TraceRequest],
    layout: dict[str, int],
    costs: StageCosts,
    rate_per_gpu: float,
    stage_batching: bool = True,
    dual_stream: bool = True,
) -> Attainment:
    """Replays `trace` at `rate_per_gpu` requests/s per instance and measures SLO attainment."""
    gpus = sum(layout.values())
    jobs = Replay(layout, costs, stage_batching, dual_stream).run(scaled(trace, rate_per_gpu * gpus))
    n = len(jobs)
    ttft = sum("first_token" in j.times and j.times["first_token"] - j.arrival <= costs.ttft_s for j in jobs)
    tbt = sum("done" in j.times and j.over <= (1 - TBT_SHARE) * j.gaps + 1e-9 for j in jobs)
    return Attainment(rate_per_gpu, sum(met_slo(j, costs) for j in jobs) / n, ttft / n, tbt / n)


def _meets(
    trace: list[TraceRequest],
    layout: dict[str, int],
    costs: StageCosts,
    rate_per_gpu: float,
    stage_batching: bool,
    dual_stream: bool,
) -> bool:
    gpus = sum(layout.values())
    allowed = math.floor((1 - ATTAINMENT) * len(trace) + 1e-9)
    replay = Replay(layout, costs, stage_batching, dual_stream, give_up_after=allowed + 1)
    jobs = replay.run(scaled(trace, rate_per_gpu * gpus))
    if replay.missed > allowed:
        return False
    return sum(not met_slo(j, costs) for j in jobs) <= allowed


def goodput(
    trace: list[TraceRequest],
    layout: dict[str, int],
    costs: StageCosts,
    stage_batching: bool = True,
    dual_stream: bool = True,
    precision: float = 0.01,
) -> float:
    """The highest per-GPU rate (requests/s per instance) at which ≥ 90 % of the trace meets both
    SLOs: bisection between a rate that meets them and one that does not, to `precision` (relative).
    0 when even a near-idle rate misses (the layout cannot meet the SLOs)."""
    if len(trace) < 2:
        raise PlannerError("goodput needs a trace of at least 2 requests (it scales their arrival rate)")
    lo, hi = 0.0, 1.0
    while _meets(trace, layout, costs, hi, stage_batching, dual_stream):
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise PlannerError(
                f"goodput: layout {layout_name(layout)} meets the SLOs even with all {len(trace)} requests "
                "arriving at once; replay a longer trace (it must load the layout for longer than the TTFT SLO)"
            )
    floor = 1e-3
    if lo == 0.0:
        while hi > floor and not _meets(trace, layout, costs, hi / 2, stage_batching, dual_stream):
            hi /= 2
        if hi <= floor:
            return 0.0
        lo, hi = hi / 2, hi
    while hi - lo > precision * lo:
        mid = (lo + hi) / 2
        if _meets(trace, layout, costs, mid, stage_batching, dual_stream):
            lo = mid
        else:
            hi = mid
    return lo


def stage_work(trace: Iterable[TraceRequest], costs: StageCosts, instances: int) -> dict[str, int]:
    """Algorithm 2 lines 1-12: instances for E, P and D in proportion to the time each stage's work
    takes at full-load throughput (at its budget), each at least one (largest remainders)."""
    trace = list(trace)
    w_e = sum(r.images * costs.image_tokens for r in trace)
    w_p = sum(r.text_tokens + r.images * costs.image_tokens for r in trace)
    w_d = sum(r.output_tokens - 1 for r in trace)
    tau_e = stage_budgets("E", costs).images
    tau_p = stage_budgets("P", costs).tokens
    # Line 9: decode batches are also bounded by the KV cache (γ = 0.9 of it per request's tokens).
    per_request = (w_p + w_d) / len(trace)
    tau_d = max(1, min(stage_budgets("D", costs).tokens, int(0.9 * costs.kv_capacity_tokens / per_request)))
    context = int(per_request)
    seconds = {
        "E": w_e / (tau_e * costs.image_tokens / costs.encode_s(tau_e)) if w_e else 0.0,
        "P": w_p / (tau_p / costs.llm_s(tau_p, 0)),
        "D": w_d / (tau_d / costs.llm_s(tau_d, tau_d * context)),
    }
    return partition(instances, seconds)


def partition(instances: int, seconds: dict[str, float]) -> dict[str, int]:
    """`instances` split in proportion to `seconds`, rounded, each stage at least one: the stage
    furthest under its share gains an instance, the one furthest over it loses one."""
    stages = list(seconds)
    if instances < len(stages):
        raise PlannerError(f"{instances} instances cannot hold {len(stages)} separate stages")
    total = sum(seconds.values()) or 1.0
    share = {s: instances * seconds[s] / total for s in stages}
    counts = {s: max(1, math.floor(share[s])) for s in stages}
    while sum(counts.values()) < instances:
        counts[max(stages, key=lambda s: share[s] - counts[s])] += 1
    while sum(counts.values()) > instances:
        counts[min((s for s in stages if counts[s] > 1), key=lambda s: share[s] - counts[s])] -= 1
    return counts


def method_layouts(split: dict[str, int]) -> dict[str, dict[str, int]]:
    """Algorithm 2 lines 14-16: E+P+D, EP+D and ED+P at one E/P/D split."""
    e, p, d = split["E"], split["P"], split["D"]
    return {"E+P+D": {"E": e, "P": p, "D": d}, "EP+D": {"EP": e + p, "D": d}, "ED+P": {"ED": e + d, "P": p}}


def all_layouts(instances: int) -> list[dict[str, int]]:
    """Every E+P+D, EP+D and ED+P layout of `instances` (each kind at least one): 35 for 8."""
    layouts: list[dict[str, int]] = [{"EP": k, "D": instances - k} for k in range(1, instances)]
    layouts += [{"ED": k, "P": instances - k} for k in range(1, instances)]
    layouts += [
        {"E": e, "P": p, "D": instances - e - p}
        for e in range(1, instances - 1)
        for p in range(1, instances - e)
    ]
    return layouts


@dataclass(frozen=True)
class LayoutChoice:
    """Algorithm 2's result: the layout kept and every candidate's goodput (requests/s per GPU)."""

    layout: dict[str, int]
    goodput: float
    candidates: dict[str, float]


def hybrid_layout(trace: list[TraceRequest], costs: StageCosts, instances: int) -> LayoutChoice:
    """Algorithm 2: the best of E+P+D, EP+D and ED+P at the work-proportional split, by replayed goodput."""
    candidates = {}
    best: tuple[float, dict[str, int]] | None = None
    for layout in method_layouts(stage_work(trace, costs, instances)).values():
        rate = goodput(trace, layout, costs)
        candidates[layout_name(layout)] = rate
        if best is None or rate > best[0]:
            best = (rate, layout)
    assert best is not None
    return LayoutChoice(best[1], best[0], candidates)
