"""The `sim` backend: an emulated executor whose service time follows a profile.

Whole deployments of large models can then run on CPU with fake GPUs: the runtime, data plane
and routing are real, only the model computation is replaced by waiting. Output values come from
a value function (for example the toy executors) or are synthesised from the output type.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import hashlib
import inspect
import os
import threading
import time
import types
import typing
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from prismserve.executors.base import AsyncBatcher, Executor, queue_key
from prismserve.executors.sim_engine import EngineCore, SimRequest, StepCosts
from prismserve.protocol.chat import TextDelta
from prismserve.task import DataHandle, Stream, TaskInput, UnitTask


class SimProfile(BaseModel):
    """Service-time model of one replica.

    A request alone takes `latency_s * w + token_s * t`, where `w` is its input's `sim_work` (1 for
    inputs without that field) and `t` its tokens (`UnitTask.pending_tokens`: media tokens for an
    encoder, the prompt for an LLM); a batch of b requests takes the mean of theirs times
    `1 + batch_growth * (b - 1)`. Streams produce `items` items after that, one every
    `item_s * (1 + g * (active - 1))` with `active` streams decoding at once and `g` the
    `decode_growth` (default: `batch_growth`; decode is memory-bound and grows slower than prefill).
    Synthesised DataHandle payloads are `payload_bytes` long.

    With `continuous` (an engine with continuous batching, such as vLLM's), requests do not wait
    for a batch to finish: up to `max_batch` run at once and, while n run, each advances through
    its time alone at the rate 1 / (1 + batch_growth * (n - 1)) (processor sharing); the
    rest wait in arrival order. A full engine serves the same requests/s either way.

    With `engine` (an LLM on vLLM), the replica runs vLLM's step loop instead
    (`prismserve.executors.sim_engine`): the prompt is `t` tokens, a stream produces the input's
    `max_tokens` (else `items`) tokens one engine step at a time, and its encoding (the input's
    `sim_encode_s` seconds, the engine's `encode_item_s` per raw media item and `embed_item_s` per
    item encoded apart) runs inside the step its prompt starts in.

    `tp_speedup[g]`: how much faster a replica on `g` GPUs serves than on one (tensor parallelism;
    a GPU count not listed runs at 1x). Encoders scale poorly (003 Figure 9), LLMs well.

    Waiting requests are taken by `queue_key`: the least slack to their request's SLO deadline first
    (service time counted), then by their input's `sim_priority` (0 without that field), higher
    first, then in arrival order: an engine that schedules requests continuing a path (a later
    hop) before new ones (work in progress first), as a path's tasks can ask with it.

    `cpu_share`: the part of a batch's seconds the component computes on the host's CPU (an
    encoder run on the CPU, as on a machine without GPUs): spent as CPU time in a worker thread,
    the rest slept, so it takes its share of the cores from everything else on them, as the real
    one does. `cpu_growth`: how that CPU grows with the batch, (1 + cpu_growth (b - 1)) times one
    request's (None: as its seconds, by `batch_growth`). A CPU encoder computes every image of a
    batch, so its CPU can grow faster than its seconds; a batch lasts at least its CPU.
    """

    latency_s: float = Field(default=0.0, ge=0)
    token_s: float = Field(default=0.0, ge=0)
    batch_growth: float = Field(default=0.0, ge=0)
    max_batch: int = Field(default=1, ge=1)
    items: int = Field(default=8, ge=0)
    item_s: float = Field(default=0.0, ge=0)
    decode_growth: float | None = Field(default=None, ge=0)
    payload_bytes: int = Field(default=1024, ge=0)
    continuous: bool = False
    engine: StepCosts | None = None
    tp_speedup: dict[int, float] = Field(default_factory=dict)
    cpu_share: float = Field(default=0.0, ge=0, le=1)
    cpu_growth: float | None = Field(default=None, ge=0)

    def batch_time(self, size: int, work: float = 1.0) -> float:
        """Seconds one batch of `size` requests of mean work `work` takes."""
        return self.latency_s * work * (1 + self.batch_growth * (size - 1))

    def full_batch_rate(self) -> float | None:
        """Tokens/s one replica serves with its batch full (None: its time does not follow tokens)."""
        if self.token_s <= 0:
            return None
        return self.max_batch / (self.token_s * (1 + self.batch_growth * (self.max_batch - 1)))


ValueFunction = Callable[[UnitTask[Any, Any], Any], Any]


class SimExecutor(Executor[UnitTask[Any, Any], TaskInput, Any]):
    """Waits as the profile says, then returns the value function's output (or a synthesised one)."""

    def __init__(
        self, task: UnitTask[Any, Any], profile: SimProfile, values: ValueFunction | None = None
    ) -> None:
        super().__init__(task)
        self.profile = profile
        self._values = values
        self._batcher: AsyncBatcher[Any, None] = AsyncBatcher(
            self._serve_batch, profile.max_batch, _priority, self._seconds
        )
        self._sharing = SharedEngine(profile) if profile.continuous else None
        self._steps = StepLoop(profile.engine) if profile.engine is not None else None
        self._decoding = 0
        self._speed = profile.tp_speedup.get(round(task.gpus), 1.0) if task.gpus >= 1 else 1.0

    def _seconds(self, task_input: Any) -> float:
        """The seconds `task_input` takes alone (batch 1)."""
        profile = self.profile
        tokens = self.task.pending_tokens(task_input) if profile.token_s else 0
        return (profile.latency_s * _work(task_input) + profile.token_s * tokens) / self._speed

    def _engine_request(self, task_input: Any, output_tokens: int) -> SimRequest:
        """The step loop's request for `task_input`: its prompt tokens and media."""
        costs = self.profile.engine
        assert costs is not None
        raw_items = len(getattr(task_input, "media", None) or ())  # the engine's encoder runs these
        encoded = len(getattr(task_input, "encoded", None) or ())  # embeddings from an encoder apart
        items_s = costs.admit_item_s * (raw_items + encoded)  # its frontend takes every item
        return SimRequest(
            prompt_tokens=self.task.pending_tokens(task_input),
            output_tokens=output_tokens,
            encode_s=float(getattr(task_input, "sim_encode_s", 0.0)),
            raw_items=raw_items,
            embedded_items=encoded,
            admit_s=costs.admit_s * costs.admit_cpu_share + items_s * costs.admit_item_cpu_share,
            handoff_s=costs.admit_s * (1 - costs.admit_cpu_share)
            + items_s * (1 - costs.admit_item_cpu_share),
            media=raw_items + encoded > 0,
        )

    async def _serve_batch(self, inputs: list[Any]) -> list[None]:
        profile, size = self.profile, len(inputs)
        alone = sum(self._seconds(item) for item in inputs) / size
        seconds = alone * (1 + profile.batch_growth * (size - 1))
        growth = profile.batch_growth if profile.cpu_growth is None else profile.cpu_growth
        cpu = alone * profile.cpu_share * (1 + growth * (size - 1))
        if cpu > 0:  # the CPU part takes longer where the cores are busy; the rest does not
            await asyncio.to_thread(_spend_cpu, cpu)
        await _sleep(max(0.0, seconds - cpu))
        return [None] * size

    async def _service(self, task_input: Any) -> None:
        timed = self.profile.latency_s > 0 or self.profile.token_s > 0
        if self._steps is not None:  # a call that is not a stream: its prompt and first token
            async for _ in self._steps.tokens(self._engine_request(task_input, 1)):
                pass
        elif timed and self._sharing is not None:
            await self._sharing.run(self._seconds(task_input), _priority(task_input))
        elif timed:
            await self._batcher.submit(task_input)
        elif self._values is None:
            # Nothing to emulate, but yield as an engine would; a value function (tests, the
            # in-process runtime) yields where it does itself.
            await asyncio.sleep(0)

    async def run(self, task_input: Any) -> Any:
        await self._service(task_input)
        if self._values is None:
            return synthesize(type(self.task).output_type, self.profile)
        return await self._value(task_input)

    async def stream(self, task_input: Any) -> AsyncIterator[Any]:
        if self._steps is not None:
            async for item in self._stepped(task_input):
                yield item
            return
        await self._service(task_input)
        if self._values is None:
            source: AsyncIterator[Any] = _synthesized_items(type(self.task).output_type, self.profile.items)
        elif inspect.isasyncgenfunction(self._values):
            source = self._values(self.task, task_input)
        else:  # a function that returns a Stream (or another async iterable)
            source = await self._value(task_input)
        self._decoding += 1
        try:
            async for item in source:
                yield item
                if self.profile.item_s > 0 or self._values is None:
                    growth = (
                        self.profile.batch_growth
                        if self.profile.decode_growth is None
                        else self.profile.decode_growth
                    )
                    await _sleep(self.profile.item_s * (1 + growth * (self._decoding - 1)))
        finally:
            self._decoding -= 1

    async def _stepped(self, task_input: Any) -> AsyncIterator[Any]:
        """A stream paced by the step loop: one item per token the engine produces."""
        assert self._steps is not None
        count = getattr(task_input, "max_tokens", None) or self.profile.items
        tokens = self._steps.tokens(self._engine_request(task_input, max(1, count)))
        if self._values is None:
            source: AsyncIterator[Any] = _synthesized_items(type(self.task).output_type, count)
        elif inspect.isasyncgenfunction(self._values):
            source = self._values(self.task, task_input)
        else:
            source = aiter(await self._value(task_input))
        try:
            async for ready in tokens:
                items = [item for _ in range(ready) if (item := await anext(source, _END)) is not _END]
                for item in _merged(items):
                    yield item
                if len(items) < ready:
                    return
        finally:
            await tokens.aclose()

    async def _value(self, task_input: Any) -> Any:
        """The value function's result; a plain function runs in a worker thread (it may block)."""
        if inspect.iscoroutinefunction(self._values):
            return await self._values(self.task, task_input)
        result = await asyncio.to_thread(self._values, self.task, task_input)  # type: ignore[arg-type]
        return await result if inspect.isawaitable(result) else result


class SharedEngine:
    """Processor sharing among at most `max_batch` requests: the continuous-batching service model.

    One loop advances every running request by the time elapsed times the current per-request
    rate, finishes those that are done, admits waiting ones, and sleeps until the next finish or
    the next arrival.
    """

    def __init__(self, profile: SimProfile) -> None:
        self.profile = profile
        self._running: dict[asyncio.Future[None], float] = {}  # request -> batch-1 seconds left
        # (queue key, request, seconds), in the order they are admitted
        self._waiting: list[tuple[tuple[float, float, int], asyncio.Future[None], float]] = []
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    def _rate(self) -> float:
        return 1.0 / (1 + self.profile.batch_growth * (len(self._running) - 1)) if self._running else 1.0

    async def run(self, seconds: float, priority: float = 0.0) -> None:
        """Returns when a request of `seconds` (at batch 1) has been served; waiting requests are
        admitted by `queue_key` (slack to their deadline, then `priority`, then arrival)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        bisect.insort(
            self._waiting, (queue_key(priority, seconds), done, seconds), key=lambda entry: entry[0]
        )
        self._wake.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._serve())
        await done

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while self._running or self._waiting:
            while self._waiting and len(self._running) < self.profile.max_batch:
                _, future, seconds = self._waiting.pop(0)
                self._running[future] = seconds
            rate = self._rate()
            self._wake.clear()
            timeout = min(self._running.values()) / rate
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(timeout, 0.0))
            now = loop.time()
            advanced = (now - last) * rate
            last = now
            for future in list(self._running):
                self._running[future] -= advanced
                if self._running[future] <= 1e-9:
                    del self._running[future]
                    if not future.done():
                        future.set_result(None)


class StepLoop:
    """An `EngineCore` run in real time in a thread of its own, as vLLM's engine core runs in a
    process of its own: each step sleeps its seconds, then hands its tokens to the event loop.

    A thread, not a task of the event loop: the loop's timers wake on whole milliseconds (epoll),
    which would round steps of a millisecond or two, and a busy loop (the replica's other work)
    would stop the engine. Steps are timed against a running deadline: a step that ends late (a busy CPU) is
    followed by the steps already due at once, so the engine keeps its modelled pace. A request
    joins the first step that starts after it arrived.

    `$PRISMSERVE_SIM_ENGINE_CPUS` (cores, `0` or `0,1`) keeps the thread on those cores, as a real
    engine runs apart from its frontend (vLLM binds its threads with `VLLM_CPU_OMP_THREADS_BIND`):
    the thread sleeps through its steps, but where it shares a core with frontends spending CPU its
    wake-ups come late, and every step with them.
    """

    def __init__(self, costs: StepCosts) -> None:
        self.core = EngineCore(costs)  # touched by the engine thread only, but for `check`
        self._arrived: deque[tuple[float, SimRequest]] = deque()
        self._aborted: deque[SimRequest] = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # the thread's start and idle exit
        self._thread: threading.Thread | None = None
        self._media_frontend = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim-media")
        self._media_until = 0.0  # when the media processing queued so far ends (perf_counter)
        self._media_queued = 0.0  # its CPU seconds not yet spent
        self._media_pace = 1.0  # wall seconds per CPU second of the last item processed
        self._cpus = _engine_cpus()  # read here: a bad value fails the load, not the engine's thread

    async def tokens(self, request: SimRequest) -> AsyncGenerator[int]:
        """Yields how many tokens of `request` are ready, once per wake-up: one per step, or all the
        steps' tokens that came while this event loop was held up, as vLLM's output collector
        merges the deltas its frontend could not hand out in time. Leaving early aborts the
        request in the engine."""
        self.core.check(request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bool] = asyncio.Queue()
        request.tag = (loop, queue)
        if request.admit_s > 0:
            await self._admit(loop, request)
        if request.handoff_s > 0:
            await asyncio.sleep(request.handoff_s)
        with self._lock:
            self._arrived.append((time.perf_counter(), request))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sim-engine", daemon=True)
                self._thread.start()
        self._wake.set()
        try:
            while await queue.get():
                ready, more = 1, True
                while more and not queue.empty():
                    more = queue.get_nowait()
                    ready += more
                if output_s := self.core.costs.output_token_s * ready:
                    _spend_cpu(output_s)  # on the loop, as vLLM's output handler
                yield ready
                if not more:
                    return
        finally:
            if not request.finished:
                self._aborted.append(request)
                self._wake.set()

    async def _admit(self, loop: asyncio.AbstractEventLoop, request: SimRequest) -> None:
        """The frontend's work for `request`, off the event loop as vLLM's renderer does it: a prompt
        with media on its one media-processor thread (they queue there), a text prompt's
        tokenization on a pool once it has waited out `admit_wait_share` of the media processing
        queued (`StepCosts`). It is CPU work on the host, so it is spent as CPU time and takes
        longer where the host's cores are busy: the queue ends when its CPU seconds end at the pace
        the host ran the last item, not at an idle host's."""
        now = time.perf_counter()
        if request.media:
            self._media_queued += request.admit_s
            self._media_until = max(self._media_until, now) + request.admit_s * self._media_pace
            try:
                wall = await loop.run_in_executor(self._media_frontend, _spend_cpu, request.admit_s)
            finally:  # an aborted request's item leaves the count too
                self._media_queued -= request.admit_s
            if request.admit_s > 0:
                self._media_pace = max(1.0, wall / request.admit_s)
            self._media_until = time.perf_counter() + self._media_queued * self._media_pace
            return
        wait = self.core.costs.admit_wait_share * (self._media_until - now)
        if wait > 0:
            await asyncio.sleep(wait)
        await loop.run_in_executor(None, _spend_cpu, request.admit_s)

    def _run(self) -> None:
        if self._cpus:
            os.sched_setaffinity(0, self._cpus)  # this thread only
        deadline = time.perf_counter()
        while True:
            while self._aborted:
                request = self._aborted.popleft()
                with self._lock:  # `tokens` appends to it meanwhile
                    self._arrived = deque(item for item in self._arrived if item[1] is not request)
                self.core.abort(request)
            if not self.core.busy and not self._arrived:
                self._wake.clear()
                if self._aborted or self._arrived or self._wake.wait(_IDLE_EXIT_S):
                    continue
                with self._lock:  # idle: end, unless a request came as the wait ran out
                    if not self._arrived:
                        self._thread = None
                        return
                continue
            if not self.core.busy:  # idle until now: the next step starts at the arrival
                deadline = max(deadline, self._arrived[0][0])
            while self._arrived and self._arrived[0][0] <= deadline:
                self.core.add(self._arrived.popleft()[1])
            step = self.core.step()
            deadline += step.seconds
            time.sleep(max(0.0, deadline - time.perf_counter()))
            for request in step.produced:
                _hand_out(request, True)
            for request in step.finished:
                _hand_out(request, False)


def _engine_cpus() -> set[int]:
    """The cores `$PRISMSERVE_SIM_ENGINE_CPUS` names for a step loop's thread (none: anywhere)."""
    value = os.environ.get("PRISMSERVE_SIM_ENGINE_CPUS", "")
    cores = [core.strip() for core in value.split(",") if core.strip()]
    if not all(core.isdigit() and int(core) < (os.cpu_count() or 1) for core in cores):
        raise ValueError(
            f"PRISMSERVE_SIM_ENGINE_CPUS={value!r}: name this machine's cores, comma-separated "
            f"(0 to {(os.cpu_count() or 1) - 1}), or leave it unset"
        )
    return {int(core) for core in cores}


_IDLE_EXIT_S = 1.0  # an engine thread with nothing to do for this long ends (the next request starts one)


_END = object()


def _merged(items: list[Any]) -> list[Any]:
    """An LLM's text deltas merged into one, as vLLM hands out the tokens its frontend fell behind
    on in one delta; other items as they are."""
    if len(items) < 2 or not all(isinstance(item, TextDelta) for item in items):
        return items
    logprobs = tuple(lp for item in items for lp in item.logprobs or ())
    return [
        dataclasses.replace(
            items[-1],
            text="".join(item.text for item in items),
            tokens=sum(item.tokens or 1 for item in items),
            logprobs=logprobs or None,
        )
    ]


def _hand_out(request: SimRequest, more: bool) -> None:
    """From the engine thread: tell `request`'s stream of a token (`more`) or of its end."""
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[bool]
    loop, queue = request.tag  # type: ignore[misc]
    with contextlib.suppress(RuntimeError):  # its loop closed: nobody is waiting
        loop.call_soon_threadsafe(queue.put_nowait, more)


def _work(task_input: Any) -> float:
    """A request's work in units of the profile's latency: its input's `sim_work`, else 1."""
    return float(getattr(task_input, "sim_work", 1.0))


def _priority(task_input: Any) -> float:
    """A request's place among those waiting: its input's `sim_priority`, higher first."""
    return float(getattr(task_input, "sim_priority", 0))


def _spend_cpu(seconds: float) -> float:
    """Keep this thread busy until it has used `seconds` of CPU time, hashing: C code that lets
    other threads run meanwhile, as a real frontend's tokenizer or image processor does. Returns the
    wall seconds that took (more than `seconds` where the core was shared)."""
    start, end = time.perf_counter(), time.thread_time() + seconds
    while time.thread_time() < end:
        hashlib.sha256(_BLOCK).digest()
    return time.perf_counter() - start


_BLOCK = bytes(16 << 10)  # hashing it takes some microseconds, with the GIL released


async def _sleep(seconds: float) -> None:
    # Yield to the loop even for zero-latency profiles, as a real engine would.
    await asyncio.sleep(seconds if seconds > 0 else 0)


def synthesize(output_type: Any, profile: SimProfile) -> Any:
    """An output of `output_type` with placeholder values of plausible size."""
    values = {
        name: _synthesize_value(info.annotation, profile) for name, info in output_type.model_fields.items()
    }
    return output_type.model_validate(values)


def _synthesize_value(annotation: Any, profile: SimProfile) -> Any:
    origin = typing.get_origin(annotation)
    if annotation is DataHandle or origin is DataHandle:
        return np.zeros(max(1, profile.payload_bytes // 4), dtype=np.float32)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _synthesize_value(args[0], profile) if len(args) == len(typing.get_args(annotation)) else None
    if annotation is Stream or origin is Stream:
        return None
    if origin in (list, tuple, set):
        return []
    if origin is dict:
        return {}
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return synthesize(annotation, profile)
        if issubclass(annotation, bytes):
            return b"\0" * profile.payload_bytes
        for kind, value in ((bool, False), (str, ""), (int, 0), (float, 0.0)):
            if issubclass(annotation, kind):
                return value
    return None


async def _synthesized_items(stream_type: Any, count: int) -> AsyncIterator[Any]:
    (item_type,) = typing.get_args(stream_type) or (str,)
    for i in range(count):
        if item_type is bytes:
            yield bytes(8)
        elif item_type is str:
            yield f"t{i}"
        elif dataclasses.is_dataclass(item_type) and isinstance(item_type, type):
            # A record such as an LLM's TextDelta: its defaults, with a token of text where it has one.
            names = {f.name for f in dataclasses.fields(item_type)}
            yield item_type(**{k: v for k, v in (("text", f"t{i} "), ("tokens", 1)) if k in names})
        else:
            yield i
