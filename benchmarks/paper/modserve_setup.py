"""ModServe's own set-up (003 §5.1) for the cluster simulator: its two models' costs and its workload.

Every number below is a named constant with its source or reason. The paper gives its figures as
plots; what its text states is used, the rest is derived from the models' sizes on an A100-80GB.

Costs (per instance; `prismserve.emulate.des` runs them):
- Encoders: compute-bound (003 Insight 2, Figure 6d: SM ~100 %), so seconds = 2 x parameters x
  patches / (MFU x peak). Cross-check with 003 §3.1: InternViT-6B's median encoding is 10x
  SigLIP-400M's (LLaVA-OV: 10 tiles x 729 tokens): 5 x 1025 x 5.9e9 / (7290 x 0.4e9) = 10.4x.
- Encoder TP speed-ups: 003 Figure 9 / §3.1 — Llama's 630M ViT is fastest at TP-4 and slower at
  TP-8; InternViT-6B gains 1.3x from TP-4 to TP-8. The other points are assumptions.
- LLM prefill: calibrated so that encoding is Figure 5's share of an isolated one-image request's
  TTFT at Table 1's TP (InternVL-26B 25 % at TP-8, Llama3.2-11B 79 % at TP-4), the text being
  `CALIBRATION_TEXT_TOKENS`; decode steps read the weights and the KV cache at HBM bandwidth.
- Images: Table 1's tokens per image (InternVL 5 tiles x 256, Llama 4 tiles x 1601).

Workload (003 §5.1: trace arrivals, image counts 0–16 from the production trace): the Azure LMM
2025 trace's CDFs (`shared/workloads/azure_lmm_2025/distributions_read_from_plots.txt`, read off
the dataset's published plots; the raw CSV could not be obtained) for image counts (conditioned on
<= 16, the paper's range), prompt and output tokens; arrivals from the ServeGen trace's timestamps
(bursty; the Azure timestamps are not available here) scaled to each rate.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from functools import cache

from prismserve.bench.workloads import Arrivals, servegen
from prismserve.emulate.des import Cluster, EncoderCosts, Request, simulate_cluster
from prismserve.executors.sim_engine import StepCosts

A100_BF16_FLOPS = 312e12
MFU = 0.5  # compute-bound kernels at half of peak (encoders; FLOP cross-check of 003 §3.1 above)
A100_HBM_BYTES_S = 2.0e12 * 0.8  # decode reads at 80 % of the A100-80GB's 2.0 TB/s
A100_BYTES = 80e9
KV_MEMORY_SHARE = 0.9  # vLLM's gpu_memory_utilization default
LLM_TP_SPEEDUP = {1: 1.0, 4: 3.2, 8: 5.5}  # assumption: 80 % / 69 % TP efficiency for prefill
BATCH_OVERHEAD_S = 0.002  # per encoder call (launch, pre/post-processing on the GPU): assumption
ENCODER_MAX_BATCH = 4  # 003 §4.2: image instances "may forgo batching"; small batches suffice
MAX_BATCHED_TOKENS = 16384  # vLLM 0.7.2 V0, multimodal, no chunked prefill: max_model_len (16K)
CALIBRATION_TEXT_TOKENS = 100  # the text of Figure 5's isolated request (not stated): assumption
MAX_IMAGES = 16  # 003 §5.1: "the number of images ... ranges from 0 to 16"
MAX_PROMPT_TOKENS = 8192  # longer text prompts are cut (the trace's 99.4th percentile is ~20K)
MAX_OUTPUT_TOKENS = 2000
# Image requests' text: 003 §5.1 reuses ShareGPT-4o's prompts (questions about the image; Figure 4
# gives them only as a plot): assumed log-uniform over 16–512 tokens. Text-only requests take the
# trace's ContextTokens (all of it text).
IMAGE_TEXT_TOKENS = (16, 512)


@dataclass(frozen=True)
class PaperModel:
    """One of 003's evaluation models on A100s: encoder and LLM costs, as the simulator takes them."""

    name: str
    arch: str  # DecOnly: image tokens go through the LLM's prefill; CroAttn: only cross-attention
    tokens_per_image: int
    encoder_s_per_token: float  # one GPU
    encoder_tp_speedup: dict[int, float]
    llm_params: float
    llm_kv_bytes_per_token: float
    encoder_params: float
    fig5_encode_share: float
    fig5_tp: int
    cross_s_per_image_token: float = 0.0  # CroAttn: the cross-attention K/V projections (TP-4)

    @property
    def encoder(self) -> EncoderCosts:
        return EncoderCosts(
            s_per_token=self.encoder_s_per_token,
            batch_s=BATCH_OVERHEAD_S,
            max_batch=ENCODER_MAX_BATCH,
            tp_speedup=self.encoder_tp_speedup,
        )

    def step_s(self, gpus: int) -> float:
        """A decode step's fixed part: the weights read once, split over `gpus` GPUs."""
        return 2 * self.llm_params / (gpus * A100_HBM_BYTES_S)

    def prefill_token_s(self, gpus: int) -> float:
        """Calibrated to Figure 5 (module docstring): encode share of the isolated TTFT at `fig5_tp`."""
        tp = self.fig5_tp
        encode = self.encoder.seconds(self.tokens_per_image, tp)
        rest = encode * (1 - self.fig5_encode_share) / self.fig5_encode_share - self.step_s(tp)
        tokens = CALIBRATION_TEXT_TOKENS + (self.tokens_per_image if self.arch == "DecOnly" else 0)
        at_tp = max(rest, 0.0) / tokens
        return at_tp * LLM_TP_SPEEDUP[tp] / LLM_TP_SPEEDUP[gpus]

    def llm(self, gpus: int = 4) -> StepCosts:
        """An LLM instance on `gpus` GPUs, vLLM's scheduler limits, its KV capacity."""
        memory = gpus * A100_BYTES * KV_MEMORY_SHARE - 2 * (self.llm_params + self.encoder_params)
        return StepCosts(
            step_s=self.step_s(gpus),
            prefill_token_s=self.prefill_token_s(gpus),
            decode_seq_s=0.00005,  # sampling and per-sequence kernels: assumption
            context_token_s=self.llm_kv_bytes_per_token / (gpus * A100_HBM_BYTES_S),
            max_num_batched_tokens=MAX_BATCHED_TOKENS,
            max_num_seqs=256,  # vLLM's default
            kv_capacity_tokens=int(memory / self.llm_kv_bytes_per_token),
        )

    def prefill_mfu(self) -> float:
        """The prefill efficiency the calibration implies (a check on it, reported)."""
        return 2 * self.llm_params / (self.prefill_token_s(1) * A100_BF16_FLOPS)

    def request(self, arrival: float, text: int, output: int, images: int) -> Request:
        tokens = (self.tokens_per_image,) * images
        image_tokens = self.tokens_per_image * images
        deconly = self.arch == "DecOnly"
        return Request(
            arrival,
            text,
            output,
            tokens,
            llm_tokens=text + (image_tokens if deconly else 0),
            llm_extra_s=0.0 if deconly else self.cross_s_per_image_token * image_tokens,
        )


def _encoder_s_per_token(params: float, patches_per_tile: int, tokens_per_tile: int) -> float:
    return 2 * params * patches_per_tile / (MFU * A100_BF16_FLOPS) / tokens_per_tile


INTERNVL = PaperModel(
    name="InternVL-26B",
    arch="DecOnly",
    tokens_per_image=5 * 256,  # Table 1
    encoder_s_per_token=_encoder_s_per_token(5.9e9, 1025, 256),  # InternViT-6B, 448 px, 14 px patches
    encoder_tp_speedup={1: 1.0, 2: 1.7, 4: 2.6, 8: 3.4},  # 4 -> 8: 1.3x (003 §3.1)
    llm_params=20e9,  # InternLM2-20B
    llm_kv_bytes_per_token=2 * 48 * 8 * 128 * 2,  # K and V, 48 layers, 8 KV heads of 128, bf16
    encoder_params=5.9e9,
    fig5_encode_share=0.25,
    fig5_tp=8,
)
LLAMA = PaperModel(
    name="Llama3.2-11B",
    arch="CroAttn",
    tokens_per_image=4 * 1601,  # Table 1
    encoder_s_per_token=_encoder_s_per_token(0.63e9, 1601, 1601),  # ViT-H/14, 560 px
    encoder_tp_speedup={1: 1.0, 2: 1.5, 4: 1.8, 8: 1.6},  # fastest at TP-4, slower at 8 (003 §3.1)
    llm_params=10.6e9,  # Llama 3.1 8B + 8 cross-attention layers
    llm_kv_bytes_per_token=2 * 32 * 8 * 128 * 2,  # the self-attention layers' cache
    encoder_params=0.63e9,
    fig5_encode_share=0.79,
    fig5_tp=4,
    # 8 cross-attention layers project each image token to K and V (4096 -> 2 x 1024): 134 MFLOP.
    cross_s_per_image_token=8 * 2 * 2 * 4096 * 1024 / (MFU * A100_BF16_FLOPS * LLM_TP_SPEEDUP[4]),
)
MODELS = {"internvl": INTERNVL, "llama": LLAMA}

# Azure LMM 2025 trace CDFs (value, percent), read off the dataset's plots (module docstring).
IMAGE_COUNT_CDF = ((1, 66.1), (4, 70.8), (8, 70.8), (9, 85.7), (15, 87.5), (16, 87.5))
TEXT_PROMPT_CDF = (
    (1, 0.0), (100, 1.8), (200, 12.2), (300, 20.2), (500, 34.8), (700, 45.5), (1000, 61.6),
    (1500, 76.8), (2000, 83.9), (3000, 89.9), (5000, 96.1), (10000, 98.8), (20000, 99.4), (50000, 100.0),
)  # fmt: skip
OUTPUT_CDF = {
    "image": ((1, 0.3), (5, 3.0), (10, 8.3), (20, 12.8), (50, 37.8), (100, 59.8), (200, 77.1),
              (300, 83.3), (500, 95.2), (1000, 100.0)),
    "text": ((1, 6.5), (5, 8.3), (10, 14.0), (20, 22.6), (50, 31.8), (100, 43.8), (200, 67.6),
             (300, 84.2), (500, 91.1), (1000, 98.2), (2000, 99.7), (5000, 100.0)),
}  # fmt: skip


def sample_cdf(points: tuple[tuple[int, float], ...], u: float) -> int:
    """The value at quantile `u` (0–1) of a CDF given as (value, percent) points, log-linear between."""
    values, shares = [p[0] for p in points], [p[1] / points[-1][1] for p in points]
    i = bisect.bisect_left(shares, u)
    if i == 0:
        return values[0]
    if i >= len(values):
        return values[-1]
    lo, hi = shares[i - 1], shares[i]
    if hi <= lo:
        return values[i]
    frac = (u - lo) / (hi - lo)
    return max(
        1, round(math.exp(math.log(values[i - 1]) + frac * (math.log(values[i]) - math.log(values[i - 1]))))
    )


def image_count(u: float) -> int:
    """Images of an image request at quantile `u`: steps, as counts are integers."""
    share = [p[1] / IMAGE_COUNT_CDF[-1][1] for p in IMAGE_COUNT_CDF]
    i = bisect.bisect_left(share, u)
    return IMAGE_COUNT_CDF[min(i, len(share) - 1)][0]


@dataclass(frozen=True)
class Shape:
    """What one request holds (independent of the model and of time)."""

    text: int
    output: int
    images: int


@cache
def shapes(count: int, image_share: float, seed: int) -> tuple[Shape, ...]:
    """`count` requests' sizes: `image_share` of them with images (counts from the trace)."""
    draw = random.Random(seed)
    out = []
    for _ in range(count):
        images = image_count(draw.random()) if draw.random() < image_share else 0
        kind = "image" if images else "text"
        if images:
            low, high = IMAGE_TEXT_TOKENS
            text = round(math.exp(draw.uniform(math.log(low), math.log(high))))
        else:
            text = min(MAX_PROMPT_TOKENS, sample_cdf(TEXT_PROMPT_CDF, draw.random()))
        output = min(MAX_OUTPUT_TOKENS, sample_cdf(OUTPUT_CDF[kind], draw.random()))
        out.append(Shape(text, output, min(images, MAX_IMAGES)))
    return tuple(out)


@cache
def trace_times(count: int, seed: int) -> tuple[float, ...]:
    """ServeGen's bursty trace arrival times for `count` requests, starting at 0, mean gap 1 s."""
    specs = servegen(Arrivals("trace", 1.0), count=count, seed=seed)
    first, last = specs[0].arrival_s, specs[-1].arrival_s
    return tuple((s.arrival_s - first) * (count - 1) / max(last - first, 1e-9) for s in specs)


def requests(
    model: PaperModel, count: int, rate: float, image_share: float, seed: int, ttft_slo: dict[str, float]
) -> list[Request]:
    """Fresh `Request`s of the workload at `rate` requests/s (the trace's burstiness kept)."""
    out = []
    for t, shape in zip(trace_times(count, seed), shapes(count, image_share, seed), strict=True):
        request = model.request(t / rate, shape.text, shape.output, shape.images)
        request.ttft_slo_s = ttft_slo.get(request.kind, math.inf)
        out.append(request)
    return out


def median_shape(kind: str) -> Shape:
    """The isolated request that sets a type's SLO (003 §5.1: one text-only, one with one image)."""
    low, high = IMAGE_TEXT_TOKENS
    text = round(math.sqrt(low * high)) if kind == "image" else sample_cdf(TEXT_PROMPT_CDF, 0.5)
    return Shape(text, sample_cdf(OUTPUT_CDF[kind], 0.5), 1 if kind == "image" else 0)


def isolated(model: PaperModel) -> dict[str, dict[str, float]]:
    """TTFT and TBT of each type's median request alone on one monolith instance (TP-4)."""
    out = {}
    for kind in ("text", "image"):
        shape = median_shape(kind)
        request = model.request(0.0, shape.text, shape.output, shape.images)
        simulate_cluster(Cluster(llm=model.llm(4), llms=1, encoder=model.encoder), [request])
        out[kind] = {"ttft_s": request.ttft, "tbt_s": request.tbt}
    return out
