"""The emulated models of the paper's experiments (000 §7), with their deployment options.

Batching assumptions (used for latency at low load; throughput at full batch comes from Table 1):
- Encoders batch up to 8 images/clips and gain 2x over batch 1 (compute-bound vision/audio towers).
- Autoregressive parts (LLM decode, the talker) batch continuously up to 8 and gain 4x over
  batch 1 (decode is memory-bound: a batch shares each weight read). 8, by Little's law: 000 Table
  2's latencies for the planned deployment (thinker-only requests ~7-8 s, with the audio generator
  ~21-25 s at P50) are about 8 x Table 1's time per request (0.92 s thinker, 3.6 s generator).
- Prefill-only instances batch up to 8 and gain 1.5x (long prompts are compute-bound).
- Tensor parallelism over 2 GPUs: speed 1.8 (90 % scaling).
"""

from __future__ import annotations

from typing import TypedDict

from prismserve.emulate.costs import (
    InternVL3Costs,
    Llava15Costs,
    Qwen3OmniCosts,
    Qwen25VLCosts,
    QwenImageCosts,
    QwenOmniCosts,
)
from prismserve.emulate.model import EmulatedModel, EmulatedOption


class Batching(TypedDict, total=False):
    """An `EmulatedOption`'s batching fields, shared by the options of one kind."""

    max_batch: int
    batch_gain: float
    continuous: bool


class Parallelism(TypedDict):
    """An `EmulatedOption`'s GPU count and speed under tensor parallelism."""

    gpus: int
    speed: float


ENCODER: Batching = {"max_batch": 8, "batch_gain": 2.0}
DECODER: Batching = {"max_batch": 8, "batch_gain": 4.0, "continuous": True}
PREFILL: Batching = {"max_batch": 8, "batch_gain": 1.5}
TP2: Parallelism = {"gpus": 2, "speed": 1.8}

# Qwen2.5-Omni-7B (000 §7.2). The monolith is the paper's baseline, a Hugging Face transformers
# server: every component in one process, one at a time, whole static batches (assumed: padded
# batches, sized as the decoders), and "implementing continuous batching alongside
# LLM is technically challenging" (000 §7.2), so the audio generator runs at batch 1 there: its work
# is multiplied by the decoder's batch gain (4).
HF_STATIC: Batching = {**DECODER, "continuous": False}
QWEN25_OMNI = EmulatedModel(
    name="qwen25-omni",
    costs=QwenOmniCosts(),
    options=(
        EmulatedOption(name="I", components=("I",), **ENCODER),
        EmulatedOption(name="V", components=("V",), **ENCODER),
        EmulatedOption(name="A", components=("A",), **ENCODER),
        EmulatedOption(name="L", components=("L",), **DECODER),
        EmulatedOption(name="G", components=("G",), **DECODER),
        EmulatedOption(
            name="IVAL", components=("I", "V", "A", "L"), **DECODER
        ),  # the thinker with its encoders (vLLM-style)
        EmulatedOption(
            name="Monolith",
            components=("I", "V", "A", "L", "G"),
            factors={"G": DECODER["batch_gain"]},
            **HF_STATIC,
        ),
    ),
)


def _vision_llm_options(kv_with_encoder: float) -> tuple[EmulatedOption, ...]:
    """Encoder E, prefill P, decode D of a vision LLM whose instances take 2 GPUs (000 §7.3
    baselines); colocated with the encoder, decode keeps `kv_with_encoder` of its KV cache."""
    return (
        EmulatedOption(name="E", components=("E",), **ENCODER),
        EmulatedOption(name="P", components=("P",), **TP2, **PREFILL),
        EmulatedOption(name="D", components=("D",), **TP2, **DECODER),
        EmulatedOption(name="PD", components=("P", "D"), **TP2, **DECODER),
        EmulatedOption(name="EP", components=("E", "P"), **TP2, **PREFILL),
        EmulatedOption(
            name="EPD", components=("E", "P", "D"), factors={"D": 1 / kv_with_encoder}, **TP2, **DECODER
        ),
    )


# InternVL3-38B (000 §7.3): colocating the 6B encoder (12 GB of weights plus activations) with the
# LLM takes about 15 % of the 2 GPUs' KV cache, so decode there sustains 0.85x the batch.
INTERNVL3 = EmulatedModel(name="internvl3-38b", costs=InternVL3Costs(), options=_vision_llm_options(0.85))

# LLaVA-1.5-7B (TriInfer, paper 004): every option on one GPU (H20), including ED (encode and decode
# colocated, prefill apart). Per-iteration behaviour (Algorithm 1's budgets, dual streams) is the
# replay's (`planner.replay`, `Llava15Costs.stage_costs`); these batching fields shape the `sim`
# replicas, whose full-batch rates are the costs' work. ED is separable: a request visits it to
# encode and again to decode (`ED->P->ED`), so the MILP can choose it like any other option.
LLAVA15 = EmulatedModel(
    name="llava15-7b",
    costs=Llava15Costs(),
    options=(
        EmulatedOption(name="E", components=("E",), **ENCODER),
        EmulatedOption(name="P", components=("P",), **PREFILL),
        EmulatedOption(name="D", components=("D",), **DECODER),
        EmulatedOption(name="EP", components=("E", "P"), **PREFILL),
        EmulatedOption(name="ED", components=("E", "D"), separable=True, **DECODER),
        EmulatedOption(name="PD", components=("P", "D"), **DECODER),
        EmulatedOption(name="EPD", components=("E", "P", "D"), **DECODER),
    ),
)

# Qwen-Image (000 §7.3.3), deployed as prismserve's Qwen-Image app can be: the text encoder alone
# (T), the generator (DiT + VAE, G) and the whole pipeline (TG, the monolith: 7B + 20B bf16, 56 GB,
# fits one A100-80GB as in Table 1). The diffusers pipeline batches images of one kind in one call;
# a 20B DiT over 1024+ tokens per image is compute-bound, so batching gains little: assumed up to 4
# images at 1.2x over batch 1. The text encoder batches as the encoders above. T hands the
# generator the prompt's conditioning, sized for the longer prompt of §7.3.3 (2,000 tokens, 28.7 MB):
# what a split deployment moves and the monolith does not.
GENERATOR: Batching = {"max_batch": 4, "batch_gain": 1.2}
QWEN_IMAGE = EmulatedModel(
    name="qwen-image",
    costs=QwenImageCosts(),
    options=(
        EmulatedOption(
            name="T", components=("T",), payload_bytes=QwenImageCosts.conditioning_bytes(2000), **ENCODER
        ),
        EmulatedOption(name="G", components=("G",), **GENERATOR),
        EmulatedOption(name="TG", components=("T", "G"), **GENERATOR),
    ),
)


# Qwen3-Omni-30B-A3B (000 §7.2, Figures 6b and 7): the thinker's 61 GB of weights leave too little KV
# room on one A100, so thinker replicas use TP 2 (as 000 §7.2's plans do); the talker and Code2Wav
# may be apart or colocated (Figure 7b's "talker + audio generator"). The monolith is 000's
# transformers baseline on one GPU, as for Qwen2.5-Omni (static batches, the talker at batch 1); its
# memory model (`Qwen3OmniCosts.memory_gb`) rules it out on ServeGen's long contexts.
QWEN3_OMNI = EmulatedModel(
    name="qwen3-omni",
    costs=Qwen3OmniCosts(),
    options=(
        EmulatedOption(name="I", components=("I",), **ENCODER),
        EmulatedOption(name="V", components=("V",), **ENCODER),
        EmulatedOption(name="A", components=("A",), **ENCODER),
        EmulatedOption(name="L", components=("L",), **TP2, **DECODER),
        EmulatedOption(name="IVAL", components=("I", "V", "A", "L"), **TP2, **DECODER),
        EmulatedOption(name="T", components=("T",), **DECODER),
        EmulatedOption(name="C", components=("C",), **ENCODER),
        EmulatedOption(name="TC", components=("T", "C"), **DECODER),
        EmulatedOption(
            name="Monolith",
            components=("I", "V", "A", "L", "T", "C"),
            factors={"T": DECODER["batch_gain"]},
            **HF_STATIC,
        ),
    ),
)

# Qwen2.5-VL-32B (000 §7.3): as InternVL3, but its 0.67B encoder (1.4 GB of weights plus activations)
# takes about 3 % of the 2 GPUs' KV cache when colocated.
QWEN25_VL = EmulatedModel(name="qwen25-vl-32b", costs=Qwen25VLCosts(), options=_vision_llm_options(0.97))

MODELS = {m.name: m for m in (QWEN25_OMNI, QWEN3_OMNI, INTERNVL3, QWEN25_VL, LLAVA15, QWEN_IMAGE)}

# 000 §7.3 baselines, as the options they may use (replica counts are left to the planner,
# "chosen to maximize throughput given the planner output").
INTERNVL3_BASELINES = {
    "Monolith": ("EPD",),
    "E/PD": ("E", "PD"),
    "EP/D": ("EP", "D"),
    "E/P/D": ("E", "P", "D"),
}
OMNI_BASELINES = {"Monolith": ("Monolith",)}
QWEN_IMAGE_BASELINES = {"Monolith": ("TG",), "T/G": ("T", "G")}
MLLM_BASELINES = INTERNVL3_BASELINES  # the same four deployments for Qwen2.5-VL (000 §7.3 baselines)
