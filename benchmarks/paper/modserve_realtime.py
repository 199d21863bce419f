"""ModServe (papers/003) on prismserve: the ablation of modality-aware serving on `sim` executors.

An InternVL3-38B-like model (the 6B vision encoder, the LLM on 2 GPUs; costs from
prismserve.emulate's InternVL3, papers/000 Table 1) on 16 GPUs, served with the ServeGen image
workload (bursty arrivals, heavy-tailed image counts and sizes; `--image-share` of the requests
keep their images, the others are text-only). Every system below runs the same requests through the
real control plane in this process (task managers, dispatcher, replica picks, executor queues);
only the model is replaced by waiting: LLMs and the monolith run vLLM's step loop in real time
(`SimProfile.engine`, prismserve/executors/sim_engine.py), encoders batch with no gain (003
Figure 6c) and scale with their GPUs by `ENCODER_TP` (003 Figure 9):

  monolith        8 replicas of the whole model (vLLM: the encoder inside the engine step, TP-2)
  decoupled       image encoders (1 GPU) and LLMs (2 GPUs) as separate deployments; a request's
                  images in one encoder call; replicas picked by fewest calls; queues FIFO
  +slo            + SLO scheduling: executor queues serve the least slack to the request's SLO first
  +tokens         + token-aware routing: encoders and LLMs picked by fewest pending tokens
  +fan-out        + each image its own encoder call, to the encoder with the fewest pending tokens

SLOs as ModServe's §5.1, `--slo-scale` times the TTFT and TBT of a request alone on the monolith,
per request type (text, image+text), the TTFT target growing with the prompt's tokens (see
`isolated_slos`). Prints, per system and load, P50/P99 TTFT, SLO attainment and goodput (requests
meeting their SLO per second), and the largest load each sustains at `--attainment` (ModServe
reports the load at P99: 0.99), goodput over the makespan. The decoupled systems use the encoder
count (`--encoders`) and batch (`--encoder-batches`), the monolith the engine batch cap
(`--monolith-batches`), that give each the most goodput at `--split-load` on another seed's
workload (`--tune-seed`). Writes `modserve_16gpu_realtime.json`.

`--check`: the monolith and ModServe (less SLO scheduling) here and in the cluster simulator
(prismserve/emulate/des.py) on the same requests; writes `modserve_des_check.json`.

Then autoscaling (ModServe Figure 16, compressed): an image-driven burst (`burst`) served by the
monolith and by ModServe (+fan-out), each static at the shape that serves the peak and autoscaled
(prismserve.control.autoscale) from a small shape, its stages' capacities from the cost model;
prints GPU-hours (the plan's GPUs integrated over real time) and SLO attainment of each. Replicas
start at once here (a real one takes tens of seconds to load), and times run `--speedup` times
faster than real.

    python3 benchmarks/paper/modserve_realtime.py [--requests 300] [--loads 0.4,0.8] [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from PIL import Image

import prismserve  # noqa: F401  (telemetry off)
from prismserve.app.config import SLO
from prismserve.bench.workloads import Arrivals, RequestSpec, image_size, servegen
from prismserve.control.autoscale import Autoscaler
from prismserve.control.slo import SLOWindow
from prismserve.emulate.costs import InternVL3Costs
from prismserve.emulate.des import Cluster, EncoderCosts, Request, simulate_cluster
from prismserve.executors.sim_engine import StepCosts
from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.tasklib import MediaTokens

RESULTS = Path(__file__).resolve().parents[1] / "results"

GPUS = 16
LLM_GPUS = 2  # the LLM's tensor parallelism, as the emulated InternVL3's LLM instances
ITEMS = 16  # tokens each answer streams (decode does not bound these systems; TTFT is the question)

# Encoding (one A100, prismserve.emulate.costs.InternVL3Costs, 000 Table 1): seconds per media
# token. Encoders gain nothing from batching (003 Figure 6c: latency linear in the batch), so an
# encoder batch takes the sum of its images' times (`batch_growth` 1), and scale poorly with TP
# (003 Figure 9, its 6B encoder): 1.7x on 2 GPUs, inside the monolith's TP-2 replica.
ENCODE_S = InternVL3Costs.ENCODER_S_PER_TILE / InternVL3Costs.TOKENS_PER_TILE
ENCODER_TP = {1: 1.0, 2: 1.7}
LLM_TP_SPEEDUP = 1.8  # the LLM on 2 GPUs: 90 % TP efficiency (compute-bound prefill)
WEIGHT_BYTES = 2 * 32e9  # Qwen2.5-32B in bf16, read once per decode step
KV_BYTES_PER_TOKEN = 2 * 64 * 8 * 128 * 2  # K and V, 64 layers, 8 KV heads of 128, bf16
HBM_BYTES_S = 2.0e12 * 0.8  # an A100-80GB's bandwidth at 80 %


def llm_costs(max_num_seqs: int = 256) -> StepCosts:
    """The LLM (and the monolith's engine) on `LLM_GPUS` A100s as vLLM's step loop (real seconds)."""
    bandwidth = LLM_GPUS * HBM_BYTES_S
    memory = LLM_GPUS * 80e9 * 0.9 - WEIGHT_BYTES - 2 * 5.9e9  # vLLM's 0.9 share, less the weights
    return StepCosts(
        step_s=WEIGHT_BYTES / bandwidth,
        prefill_token_s=InternVL3Costs.PREFILL_S_PER_TOKEN / LLM_TP_SPEEDUP,
        decode_seq_s=0.0001,
        context_token_s=KV_BYTES_PER_TOKEN / bandwidth,
        max_num_batched_tokens=8192,
        max_num_seqs=max_num_seqs,
        kv_capacity_tokens=int(memory / KV_BYTES_PER_TOKEN),
    )


PREFILL_S = llm_costs().prefill_token_s


APP = '''
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest, TextDelta
from prismserve.task import Stream, Task, TaskInput, UnitTask
from prismserve.tasklib import MediaTokens
from prismserve.tasklib.mllm import TextOutput, conversation
from prismserve.tasklib.units import EncodedMedia, EncoderOutput, EncoderTask, LLMInput, LLMTask, MediaItem

COUNTING = MediaTokens(image="tiles")  # InternVL: 256 tokens per 448-px tile


class Encoder(EncoderTask):
    executor_kind = "sim"
    executor_ref = None


class Images(TaskInput):
    items: list[MediaItem]

    def pending_tokens(self):
        return sum(item.tokens for item in self.items)


class RequestEncoder(UnitTask[Images, EncoderOutput]):
    """All of a request's images in one call (no fan-out)."""

    executor_kind = "sim"


class LLM(LLMTask):
    executor_kind = "sim"
    executor_ref = None
    default_gpus = {llm_gpus}
    max_gpus = None


class WholeInput(LLMInput):
    sim_encode_s: float = 0.0  # seconds of encoding the raw images, inside the engine step


class Whole(UnitTask[WholeInput, Stream[TextDelta]]):
    """The monolith: encoder and LLM in one replica."""

    executor_kind = "sim"
    default_gpus = {llm_gpus}
    model: str


class Model(Task[ChatRequest, TextOutput]):
    layout: str

    def post_init(self):
        self.image = Encoder(model="vl", modality="image")
        self.images = RequestEncoder()
        self.llm = LLM(model="vl")
        self.whole = Whole(model="vl")

    def invoke(self, request):
        messages, media = conversation(request, COUNTING)
        sampling = request.sampling()
        if self.layout == "monolith":
            encode = {encode_s} * sum(item.tokens for item in media)
            whole = WholeInput(conversation=messages, media=media, sim_encode_s=encode, **sampling)
            return TextOutput(text=self.whole.invoke(whole))
        if self.layout == "fan-out":
            outputs = [(self.image.invoke(item), item.tokens) for item in media]
        else:
            outputs = [(self.images.invoke(Images(items=media)), sum(m.tokens for m in media))] if media else []
        encoded = [EncodedMedia(modality="image", embeddings=o.embeddings, meta=o.meta, tokens=t) for o, t in outputs]
        return TextOutput(text=self.llm.invoke(LLMInput(conversation=messages, encoded=encoded, **sampling)))


model = Model(layout={layout!r})


class Config(AppConfig):
    tasks = {{"model": model}}
    input_modalities = frozenset({{"text", "image"}})
    slos = {slos}
    replica_routing = {routing}
    autoscale = {autoscale}


async def serve(request: ChatRequest) -> TextOutput:
    return await model(request)
'''


@dataclass(frozen=True)
class System:
    """One configuration of the ablation."""

    name: str
    layout: str  # monolith | decoupled | fan-out
    slo_scheduling: bool = False
    token_routing: bool = False

    @property
    def encoder(self) -> str | None:
        """Its encoder deployment (None: the monolith's replicas encode)."""
        return {"monolith": None, "fan-out": "model.image"}.get(self.layout, "model.images")

    @property
    def stages(self) -> tuple[str, ...]:
        """Its deployments, as plans name them."""
        return ("model.whole",) if self.encoder is None else (self.encoder, "model.llm")


SYSTEMS = (
    System("monolith", "monolith"),
    System("decoupled", "decoupled"),
    System("+slo", "decoupled", slo_scheduling=True),
    System("+tokens", "decoupled", slo_scheduling=True, token_routing=True),
    System("+fan-out", "fan-out", slo_scheduling=True, token_routing=True),
)
MONOLITH, MODSERVE = SYSTEMS[0], SYSTEMS[-1]


def profiles(speedup: float, encoder_batch: int = 8, max_num_seqs: int = 256) -> dict[str, dict[str, Any]]:
    """The sim profiles of the deployments, their times divided by `speedup`: LLMs and the monolith
    run vLLM's step loop (`SimProfile.engine`; the monolith's `max_num_seqs` its batch cap), encoders
    batch up to `encoder_batch` images at no gain and scale with `ENCODER_TP`."""
    engine = llm_costs(max_num_seqs).scaled(1 / speedup).model_dump()
    encoder = {
        "token_s": ENCODE_S / speedup,
        "max_batch": encoder_batch,
        "batch_growth": 1.0,
        "tp_speedup": ENCODER_TP,
    }
    return {
        "model.image": encoder,
        "model.images": encoder,
        "model.llm": {"engine": llm_costs().scaled(1 / speedup).model_dump(), "items": ITEMS},
        "model.whole": {"engine": engine, "items": ITEMS},
    }


def plan(system: System, shape: dict[str, int], speedup: float, batch: int = 8) -> Plan:
    """`system`'s replicas per stage (`shape`) as cells of their own: encoders on 1 GPU, LLMs and
    monoliths on `LLM_GPUS`; `batch`: the encoders' batch, or the monolith's `max_num_seqs`."""
    cells = [
        {"gpus": 1 if stage == system.encoder else LLM_GPUS, "count": shape[stage], "replicas": {stage: 1}}
        for stage in system.stages
    ]
    chosen = profiles(speedup, batch) if system.encoder else profiles(speedup, max_num_seqs=batch)
    return Plan.model_validate({"cells": cells, "profiles": chosen})


def split(system: System, encoders: int) -> dict[str, int]:
    """The replicas of `system` on `GPUS` GPUs: `encoders` encoders and LLMs on the rest."""
    if system.encoder is None:
        return {"model.whole": GPUS // LLM_GPUS}
    return {system.encoder: encoders, "model.llm": (GPUS - encoders) // LLM_GPUS}


def app_source(
    system: System,
    slos: dict[str, dict[str, float]],
    autoscale: dict[str, Any] | None = None,
    speedup: float = 1.0,
) -> str:
    routing = {stage: "tokens" for stage in system.stages} if system.token_routing else {}
    return APP.format(
        layout=system.layout,
        slos=slos if system.slo_scheduling else {},
        routing=routing,
        autoscale=autoscale,
        llm_gpus=LLM_GPUS,
        encode_s=ENCODE_S / ENCODER_TP[LLM_GPUS] / speedup,  # the monolith encodes on its TP-2 GPUs
    )


_PNGS: dict[tuple[int, int], bytes] = {}


def png(size: tuple[int, int]) -> bytes:
    """A solid image of `size` (its header is what the token count reads), made once per size."""
    if size not in _PNGS:
        out = io.BytesIO()
        Image.new("L", size, 128).save(out, format="PNG")
        _PNGS[size] = out.getvalue()
    return _PNGS[size]


def chat(spec: RequestSpec) -> ChatRequest:
    """The request `spec` describes: `text_tokens` 4-character words, its images."""
    return ChatRequest.of("tok " * spec.text_tokens, images=[png(s) for s in spec.images])


@dataclass
class Served:
    """One request's outcome."""

    kind: str
    ttft_s: float
    tbt_s: float
    tokens: int = 0  # its prompt tokens as its calls counted them (text and media)
    ok: bool = True
    end_s: float = 0.0  # when its last token came (perf_counter)


@dataclass
class Outcome:
    """A run: every request's outcome, and the GPU-seconds its plans held (compressed time)."""

    served: list[Served]
    gpu_s: float
    seconds: float


async def serve_one(runtime: RayRuntime, app: Any, request: ChatRequest) -> Served:
    start = time.perf_counter()
    first = last = None
    items = 0
    try:
        async with runtime.request(app.name, request.request_type) as clock:
            output = await app.serve(request)
            async for _ in output.text:
                last = time.perf_counter()
                first = first or last
                items += 1
    except Exception:  # noqa: BLE001 - counted as failed, and as missing its SLO
        return Served(request.request_type, math.inf, math.inf, ok=False)
    assert first is not None and last is not None
    return Served(
        request.request_type,
        first - start,
        (last - first) / max(1, items - 1),
        clock.ledger.tokens,
        end_s=last,
    )


async def run(
    system: System,
    specs: list[RequestSpec],
    shape: dict[str, int],
    speedup: float,
    slos: dict[str, dict[str, float]],
    autoscale: dict[str, Any] | None = None,
    encoder_batch: int = 8,
) -> Outcome:
    """Serve `specs` (arrival times already compressed by `speedup`) on `system` with `shape`
    replicas per stage; with `autoscale` (Config.autoscale) its stages scale from there."""
    runtime = RayRuntime(pool=InProcessPool({"node": 64}))
    await runtime.start()
    scaler = None
    try:
        app = await runtime.register_app(app_source(system, slos, autoscale, speedup), "vl")
        await runtime.deploy("vl", plan(system, shape, speedup, encoder_batch))
        window = SLOWindow(window_s=(autoscale or {}).get("window_s", 60.0))
        if autoscale is not None:
            scaler = Autoscaler(runtime, app, window)
            scaler.start()
        requests = [chat(spec) for spec in specs]
        start = time.perf_counter()
        gpu_s = 0.0

        async def at(spec: RequestSpec, request: ChatRequest) -> Served:
            await asyncio.sleep(max(0.0, start + spec.arrival_s - time.perf_counter()))
            served = await serve_one(runtime, app, request)
            if slos:  # the isolated runs that set them have none yet
                window.record(met(served, slos))
            return served

        last = start

        def integrate() -> None:  # GPUs held x the real time since the last sample
            nonlocal gpu_s, last
            now = time.perf_counter()
            gpu_s += (now - last) * runtime.plans["vl"].total_gpus
            last = now

        async def meter() -> None:  # a lagging loop samples late, never undercounts
            while True:
                await asyncio.sleep(0.05)
                integrate()

        metering = asyncio.ensure_future(meter())
        served = await asyncio.gather(*(at(s, r) for s, r in zip(specs, requests, strict=True)))
        metering.cancel()
        integrate()
        return Outcome(served, gpu_s, time.perf_counter() - start)
    finally:
        if scaler is not None:
            await scaler.close()
        await runtime.close()


def isolated_slos(scale: float, speedup: float) -> dict[str, dict[str, float]]:
    """SLOs per request type as ModServe's (§5.1): `scale` x the latency of requests of the type
    served alone on the monolith (compressed seconds) — with the TTFT target growing with the
    request's prompt tokens (`SLO.ttft_per_token_s`), fitted through a small and a large request
    of the type: with ServeGen's tails (text p99 3086 tokens, up to 49 images), one fixed target
    from one median request is missed by an idle system for more than 1 % of requests."""
    small, large = image_size(684), image_size(1280)
    pairs = {
        "text": (RequestSpec(0.0, 106, ITEMS), RequestSpec(0.0, 3000, ITEMS)),
        "image+text": (RequestSpec(0.0, 106, ITEMS, (small,)), RequestSpec(0.0, 1000, ITEMS, (large,) * 4)),
    }
    slos = {}
    for kind, pair in pairs.items():
        alone = [
            asyncio.run(run(MONOLITH, [spec], split(MONOLITH, 0), speedup, {})).served[0] for spec in pair
        ]
        # Never negative: at high compression a loaded machine's noise can outweigh the slope.
        per_token = max(0.0, (alone[1].ttft_s - alone[0].ttft_s) / (alone[1].tokens - alone[0].tokens))
        slos[kind] = {
            "ttft_s": scale * (alone[0].ttft_s - per_token * alone[0].tokens),
            "ttft_per_token_s": scale * per_token,
            "tbt_s": scale * max(a.tbt_s for a in alone),
        }
    return slos


_COUNTING = MediaTokens(image="tiles")


def media_tokens(spec: RequestSpec) -> int:
    return sum(_COUNTING.image_tokens(*size) for size in spec.images)


def met(served: Served, slos: dict[str, dict[str, float]]) -> bool:
    """Whether a request met its type's SLO (its TTFT target for its tokens, and TBT)."""
    slo = SLO.model_validate(slos[served.kind])
    return served.ok and slo.met(served.ttft_s, served.tbt_s, math.inf, served.tokens)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Row:
    """One system at one load."""

    system: str
    load: float
    rate: float
    shape: dict[str, int]
    p50_ttft_s: float
    p99_ttft_s: float
    attainment: float
    goodput_rps: float
    failed: int
    encoder_batch: int = 8  # the decoupled systems' encoder batch; the monolith's max_num_seqs
    gpu_hours: float = 0.0  # real time (the run's GPU-seconds times the speedup), for the autoscaling runs
    mean_ttft_s: float = 0.0
    throughput_rps: float = 0.0  # requests over the makespan


def measure(
    system: System,
    timed: list[RequestSpec],
    setup: tuple[dict[str, int], int],
    args: Any,
    slos: dict,
    load: float,
    autoscale: dict[str, Any] | None = None,
) -> Row:
    """Run `system` with `setup` (replicas per stage, encoder batch) on `timed`, offered at `load` x
    the capacity estimate, and summarise it (latencies and rates in real time)."""
    shape, batch = setup
    outcome = asyncio.run(run(system, timed, shape, args.speedup, slos, autoscale, batch))
    served = outcome.served
    ttfts = [s.ttft_s * args.speedup for s in served if s.ok]
    good = sum(met(s, slos) for s in served) if slos else len(served)
    arrivals = timed[-1].arrival_s * args.speedup
    makespan = outcome.seconds * args.speedup  # first arrival (0) to the last token
    return Row(
        system.name,
        load,
        len(timed) / arrivals,
        shape,
        percentile(ttfts, 0.5),
        percentile(ttfts, 0.99),
        good / len(served),
        good / makespan,
        sum(not s.ok for s in served),
        batch,
        outcome.gpu_s * args.speedup / 3600,
        statistics.mean(ttfts),
        len(served) / makespan,
    )


def print_row(row: Row, gpu_hours: bool = False) -> None:
    shape = "+".join(str(n) for n in row.shape.values()) + (
        f"/{row.encoder_batch}" if len(row.shape) > 1 else ""
    )
    print(
        f"{row.system:<15} {shape:>7} {row.load:>5.2f} {row.rate:>6.1f} {row.p50_ttft_s:>9.2f} "
        f"{row.p99_ttft_s:>9.2f} {row.attainment:>7.3f} {row.goodput_rps:>8.2f} {row.failed:>6}"
        + (f" {row.gpu_hours:>9.3f}" if gpu_hours else ""),
        flush=True,
    )


HEADER = f"{'system':<15} {'reps':>7} {'load':>5} {'req/s':>6} {'P50 TTFT':>9} {'P99 TTFT':>9} {'attain':>7} {'goodput':>8} {'failed':>6}"


def workload(count: int, image_share: float, seed: int = 0) -> list[RequestSpec]:
    """ServeGen requests (arrivals from its trace), `image_share` of them keeping their images."""
    base = servegen(Arrivals("trace", 1.0), count=count, seed=seed)
    draw = random.Random(
        seed + 1
    )  # which requests lose their images (ServeGen's are nearly all image requests)
    return [
        s if draw.random() < image_share else RequestSpec(s.arrival_s, s.text_tokens, s.output_tokens)
        for s in base
    ]


def ablation(
    args: Any, specs: list[RequestSpec], slos: dict, capacity: float
) -> tuple[list[Row], dict[str, tuple[dict[str, int], int]]]:
    """Each system at each load, and the set-up each ran with: the decoupled ones with the encoder
    count (`--encoders`) and encoder batch (`--encoder-batches`), the monolith with the engine batch
    cap (`--monolith-batches`), that give each the most goodput at `--split-load` on a workload of
    another seed (`--tune-seed`): tuned as ModServe sizes its pools from profiles (§4.2, §5.3), not
    on the requests reported."""
    systems = [s for s in SYSTEMS if s.name in args.systems.split(",")]
    choices = [(int(e), int(b)) for e in args.encoders.split(",") for b in args.encoder_batches.split(",")]
    monolith = [(0, int(b)) for b in args.monolith_batches.split(",")]
    setups = {}
    held_out = workload(len(specs), args.image_share, seed=args.tune_seed)
    reference = retime(held_out, args.split_load * capacity * args.speedup)
    for system in systems:
        options = monolith if system.encoder is None else choices
        if len(options) == 1:
            setups[system.name] = (split(system, options[0][0]), options[0][1])
            continue
        tried = [
            measure(system, reference, (split(system, e), b), args, slos, args.split_load) for e, b in options
        ]
        best = max(tried, key=lambda row: row.goodput_rps)
        setups[system.name] = (best.shape, best.encoder_batch)
        print(
            f"{system.name}: (encoders, batch) {options} at load {args.split_load:g} -> goodput "
            f"{[round(r.goodput_rps, 2) for r in tried]}; using {best.shape}, batch {best.encoder_batch}",
            flush=True,
        )
    rows = []
    print(HEADER)
    for load in [float(x) for x in args.loads.split(",") if x]:
        timed = retime(specs, load * capacity * args.speedup)
        for system in systems:
            row = measure(system, timed, setups[system.name], args, slos, load)
            rows.append(row)
            print_row(row)
    return rows, setups


def burst(args: Any) -> list[RequestSpec]:
    """An image-driven burst (ModServe's Figure 16, compressed): `--burst-requests` ServeGen requests,
    a third with `--image-share` image requests at `--base-load` of their capacity estimate, a third
    all with images at `--peak-load` of theirs, a third like the first; Poisson arrivals in each."""
    n = args.burst_requests // 3
    rng = random.Random(2)
    mixed, images = workload(2 * n, args.image_share, seed=3), workload(n, 1.0, seed=4)
    phases = [(mixed[:n], args.base_load), (images, args.peak_load), (mixed[n:], args.base_load)]
    out, t = [], 0.0
    for specs, load in phases:
        rate = load * capacity_estimate(specs)
        for spec in specs:
            t += rng.expovariate(rate * args.speedup)
            out.append(RequestSpec(t, spec.text_tokens, spec.output_tokens, spec.images))
    return out


def autoscaling(
    args: Any,
    specs: list[RequestSpec],
    slos: dict,
    modserve: tuple[dict[str, int], int],
    monolith_batch: int = 256,
) -> list[Row]:
    """Static (a shape that serves the peak, all the time) against autoscaled (from a small shape,
    stages scaled by their token load) for the monolith and ModServe (`modserve`: its set-up in the
    ablation, here the static one)."""
    timed = burst(args)
    media = statistics.mean(media_tokens(s) for s in specs)
    text = statistics.mean(s.text_tokens for s in specs)
    per_token = (media * ENCODE_S / ENCODER_TP[LLM_GPUS] + (media + text) * PREFILL_S) / (media + text)
    batch = modserve[1]
    share = args.autoscale_utilization  # of a replica's full-batch rate: its capacity within the SLO
    capacities = {  # tokens/s (compressed time)
        "model.whole": share / per_token * args.speedup,  # prefill and encoding do not gain from batching
        "model.image": share / ENCODE_S * args.speedup,
        "model.llm": share / PREFILL_S * args.speedup,
    }
    interval = args.autoscale_interval / args.speedup
    rows = []
    print(f"\n{HEADER} GPU-hours")
    runs = (
        (MONOLITH, ({"model.whole": GPUS // LLM_GPUS}, monolith_batch), ({"model.whole": 3}, monolith_batch)),
        (MODSERVE, modserve, ({"model.image": 2, "model.llm": 2}, batch)),
    )
    for system, static, start in runs:
        settings = {
            "stages": list(system.stages),
            "capacity": {stage: capacities[stage] for stage in system.stages},
            "gpus": GPUS,
            "interval_s": interval,
            "window_s": 4 * interval,
            "scale_in_after_s": 4 * interval,
            "min_requests": 20,
        }
        for label, setup, scaled in (
            (f"{system.name} static", static, None),
            (f"{system.name} auto", start, settings),
        ):
            row = measure(system, timed, setup, args, slos, args.peak_load, scaled)
            row.system = label
            rows.append(row)
            print_row(row, gpu_hours=True)
    hours = {r.system: r.gpu_hours for r in rows}
    print(
        f"GPU-hours of autoscaled ModServe / autoscaled monolith: {hours['+fan-out auto'] / hours['monolith auto']:.2f}; "
        f"/ its static shape: {hours['+fan-out auto'] / hours['+fan-out static']:.2f}"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--loads", default="0.4,0.6,0.8,1.0", help="arrival rates, x the capacity estimate")
    parser.add_argument("--image-share", type=float, default=0.5, help="requests that keep their images")
    parser.add_argument("--slo-scale", type=float, default=5.0)
    parser.add_argument("--attainment", type=float, default=0.99)
    parser.add_argument("--speedup", type=float, default=8.0, help="sim time runs this much faster")
    parser.add_argument("--systems", default=",".join(s.name for s in SYSTEMS))
    parser.add_argument("--encoders", default="4,6,8", help="encoder GPUs the decoupled systems may use")
    parser.add_argument("--encoder-batches", default="2,8", help="encoder batch sizes they may use")
    parser.add_argument("--split-load", type=float, default=0.8)
    parser.add_argument("--monolith-batches", default="16,256", help="max_num_seqs the monolith may use")
    parser.add_argument("--tune-seed", type=int, default=7, help="the workload set-ups are tuned on")
    parser.add_argument("--burst-requests", type=int, default=1800, help="0: no autoscaling runs")
    parser.add_argument("--base-load", type=float, default=0.3)
    parser.add_argument("--peak-load", type=float, default=0.7)
    parser.add_argument("--autoscale-interval", type=float, default=8.0, help="seconds (real time)")
    parser.add_argument(
        "--autoscale-utilization",
        type=float,
        default=0.6,
        help="a replica's capacity within the SLO, x its full-batch rate",
    )
    parser.add_argument("--out", help="write the results as JSON in this folder")
    parser.add_argument("--check", action="store_true", help="only the simulator check")
    parser.add_argument("--check-loads", default="0.4,0.8")
    args = parser.parse_args()
    if args.check:
        result = check(args)
        out = Path(args.out or RESULTS)
        out.mkdir(parents=True, exist_ok=True)
        (out / "modserve_des_check.json").write_text(json.dumps(result, indent=1))
        return

    specs = workload(args.requests, args.image_share)
    capacity = capacity_estimate(specs)
    slos = isolated_slos(args.slo_scale, args.speedup)
    print(
        f"{len(specs)} ServeGen requests, {sum(1 for s in specs if s.images)} with images (mean "
        f"{statistics.mean(len(s.images) for s in specs):.2f} images a request); {GPUS} GPUs; capacity estimate "
        f"{capacity:.1f} req/s; SLOs ({args.slo_scale:g}x alone, real seconds): "
        + ", ".join(
            f"{k} TTFT {v['ttft_s'] * args.speedup:.2f} s + {v['ttft_per_token_s'] * args.speedup * 1e3:.2f} ms "
            f"a token, TBT {v['tbt_s'] * args.speedup * 1e3:.0f} ms"
            for k, v in slos.items()
        ),
        flush=True,
    )
    rows, setups = ablation(args, specs, slos, capacity)
    best = {}
    for name in dict.fromkeys(r.system for r in rows):
        ok = [r.rate for r in rows if r.system == name and r.attainment >= args.attainment]
        best[name] = max(ok, default=0.0)
    if best:
        print(f"\nlargest load meeting the SLO for {args.attainment:.0%} of requests:")
        for name, rate in best.items():
            ratio = (
                f"{rate / best['monolith']:.2f}x the monolith"
                if best.get("monolith")
                else "the monolith met it at none"
            )
            print(f"  {name:<10} {rate:>6.1f} req/s  ({ratio})")
    modserve = setups.get(MODSERVE.name, (split(MODSERVE, 6), 8))
    monolith_batch = setups.get(MONOLITH.name, ({}, 256))[1]
    scaled = autoscaling(args, specs, slos, modserve, monolith_batch) if args.burst_requests else []
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = {
            "slos": slos,
            "rows": [asdict(r) for r in rows],
            "best": best,
            "autoscaling": [asdict(r) for r in scaled],
        }
        (out / "modserve_16gpu_realtime.json").write_text(json.dumps(result, indent=1))


# --- the cluster simulator against this real-time run ---------------------------------------------

CHECK = System("+tokens +fan-out", "fan-out", token_routing=True)  # ModServe less SLO scheduling
CHECK_SHAPES = {
    MONOLITH.name: ({"model.whole": GPUS // LLM_GPUS}, 256),
    CHECK.name: ({"model.image": 6, "model.llm": 5}, 8),
}


def des_cluster(system: System, shape: dict[str, int], batch: int) -> Cluster:
    """`system` as `prismserve.emulate.des` runs it: the same engine costs, encoders and policies."""
    encoder = EncoderCosts(s_per_token=ENCODE_S, max_batch=batch, tp_speedup=ENCODER_TP)
    if system.encoder is None:
        return Cluster(llm=llm_costs(batch), llms=shape["model.whole"], llm_gpus=LLM_GPUS, encoder=encoder)
    return Cluster(
        llm=llm_costs(),
        llms=shape["model.llm"],
        llm_gpus=LLM_GPUS,
        encoder=encoder,
        encoders=shape[system.encoder],
        token_routing=system.token_routing,
        fan_out=system.layout == "fan-out",
    )


def des_requests(timed: list[RequestSpec], speedup: float) -> list[Request]:
    """`timed` (compressed arrivals) as the simulator's requests, in real seconds."""
    out = []
    for spec in timed:
        media = tuple(_COUNTING.image_tokens(*size) for size in spec.images)
        out.append(
            Request(spec.arrival_s * speedup, spec.text_tokens, ITEMS, media, spec.text_tokens + sum(media))
        )
    return out


def check(args: Any) -> dict[str, Any]:
    """The monolith and ModServe (less SLO scheduling, which the engine's queue does not do) on the
    real control plane and in the simulator, same requests, at `--check-loads`."""
    specs = workload(args.requests, args.image_share)
    capacity = capacity_estimate(specs)
    out: dict[str, Any] = {
        "capacity_rps": capacity,
        "requests": len(specs),
        "speedup": args.speedup,
        "runs": [],
    }
    for load in [float(x) for x in args.check_loads.split(",")]:
        timed = retime(specs, load * capacity * args.speedup)
        for system in (MONOLITH, CHECK):
            shape, batch = CHECK_SHAPES[system.name]
            real = measure(system, timed, (shape, batch), args, {}, load)
            done = simulate_cluster(
                des_cluster(system, shape, batch), des_requests(timed, args.speedup)
            ).requests
            ttfts = [r.ttft for r in done]
            virtual = {
                "mean_ttft_s": statistics.mean(ttfts),
                "p50_ttft_s": percentile(ttfts, 0.5),
                "p99_ttft_s": percentile(ttfts, 0.99),
                "throughput_rps": len(done) / max(r.tokens[-1] for r in done),
            }
            measured = asdict(real)
            run = {"system": system.name, "load": load, "realtime": measured, "des": virtual}
            run["ratio"] = {k: measured[k] / v for k, v in virtual.items() if v > 0}
            out["runs"].append(run)
            print(
                f"{system.name:<16} load {load:.2f}: P50 TTFT {real.p50_ttft_s:.3f} real / "
                f"{virtual['p50_ttft_s']:.3f} DES, P99 {real.p99_ttft_s:.3f} / {virtual['p99_ttft_s']:.3f}, "
                f"throughput {real.throughput_rps:.2f} / {virtual['throughput_rps']:.2f} req/s",
                flush=True,
            )
    return out


def capacity_estimate(specs: list[RequestSpec]) -> float:
    """Requests/s the 16 GPUs sustain at the workload's mean work, monolith-style (every GPU-second
    spent on encoding and prefill at full batch): what the loads are multiples of."""
    media = statistics.mean(media_tokens(spec) for spec in specs)
    text = statistics.mean(spec.text_tokens for spec in specs)
    gpu_s = LLM_GPUS * (media * ENCODE_S / ENCODER_TP[LLM_GPUS] + (media + text) * PREFILL_S)
    return GPUS / gpu_s


def retime(specs: list[RequestSpec], rate: float) -> list[RequestSpec]:
    """`specs` with their arrival times scaled to a mean of `rate` requests/s (the trace's shape kept)."""
    span = specs[-1].arrival_s - specs[0].arrival_s
    factor = (len(specs) - 1) / rate / span if span > 0 else 0.0
    first = specs[0].arrival_s
    return [
        RequestSpec((s.arrival_s - first) * factor, s.text_tokens, s.output_tokens, s.images) for s in specs
    ]


if __name__ == "__main__":
    main()
