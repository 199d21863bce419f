"""Work per component of a request, in seconds of one A100-80GB, from 000 Table 1.

Table 1 gives each component's maximum throughput on one A100 (batched). A component's work for a
request is `1 / throughput` at a reference request, scaled by the request's size; a replica at full
batch then serves `1 / mean work` requests/s, exactly the Table 1 number at the reference mix.
Every assumption is a named constant with its reason beside it.
"""

from __future__ import annotations

import math

from prismserve.bench.workloads import RequestSpec
from prismserve.tasklib.media_tokens import internvl_tiles


class CostModel:
    """Which components a request needs, and their work (A100-seconds) for it."""

    components: tuple[str, ...] = ()  # model order

    def needs(self, spec: RequestSpec) -> tuple[str, ...]:
        """The components `spec` runs through, in model order."""
        raise NotImplementedError

    def work(self, spec: RequestSpec) -> dict[str, float]:
        """A100-seconds of each needed component for `spec`."""
        raise NotImplementedError


def qwen_image_tokens(width: int, height: int) -> int:
    """Tokens a Qwen-VL / Qwen-Omni vision encoder makes of an image (one per 28x28 pixels)."""
    return math.ceil(width / 28) * math.ceil(height / 28)


class QwenOmniCosts(CostModel):
    """Qwen2.5-Omni-7B: image (I), video (V) and audio (A) encoders, thinker (L), audio generator (G).

    Table 1 (one A100): image 15.64 req/s, video 1.28, audio 34.04, thinker 1.09, audio output 0.28.
    Assumptions:
    - Table 1's image rate is for one ServeGen image of average size (684 tokens, workloads README);
      image work scales with the image's tokens.
    - One video or audio clip per request that has one (the recipe of 000 §7.2 fn 6), each costing
      Table 1's per-request time: the clips' lengths are not known.
    - The thinker and the audio generator (talker + vocoder, one component, as in Table 1) are
      decode-bound: their work scales with output tokens, Table 1 being at ServeGen's mean of 129.
    """

    components = ("I", "V", "A", "L", "G")
    REFERENCE_IMAGE_TOKENS = 684
    REFERENCE_OUTPUT_TOKENS = 129
    THROUGHPUT = {"I": 15.64, "V": 1.28, "A": 34.04, "L": 1.09, "G": 0.28}

    def needs(self, spec: RequestSpec) -> tuple[str, ...]:
        present = {
            "I": bool(spec.images),
            "V": spec.videos > 0,
            "A": spec.audios > 0,
            "L": True,
            "G": spec.audio_out,
        }
        return tuple(c for c in self.components if present[c])

    def work(self, spec: RequestSpec) -> dict[str, float]:
        t = {c: 1.0 / rate for c, rate in self.THROUGHPUT.items()}
        out = spec.output_tokens / self.REFERENCE_OUTPUT_TOKENS
        work = {
            "I": t["I"] * sum(qwen_image_tokens(w, h) for w, h in spec.images) / self.REFERENCE_IMAGE_TOKENS,
            "V": t["V"] * spec.videos,
            "A": t["A"] * spec.audios,
            "L": t["L"] * out,
            "G": t["G"] * out if spec.audio_out else 0.0,
        }
        return {c: work[c] for c in self.needs(spec)}


class InternVL3Costs(CostModel):
    """InternVL3-38B: the 6B vision encoder (E), the LLM's prefill (P) and decode (D).

    Table 1 (one A100): image input 1.13 req/s, text in/out 0.28 req/s. Assumptions:
    - Both are at 000 Table 3's Standard workload: one 1920x1080 image (8 tiles + thumbnail = 9 tiles
      of 256 tokens), 1000 text tokens in, 300 out.
    - Encoder work scales with tiles.
    - The LLM (Qwen2.5-32B inside InternVL3-38B) prefills at 50 % of the A100's 312 bf16 TFLOP/s
      (2 · 32e9 FLOPs per token): 1.36 s for the Standard request's 3304 tokens; decode is the rest
      of 1 / 0.28 s, 2.22 s for 300 tokens, i.e. 7.39 ms per output token at full batch.
    """

    components = ("E", "P", "D")
    ENCODER_S_PER_TILE = 1 / 1.13 / 9
    PREFILL_S_PER_TOKEN = 2 * 32e9 / (0.5 * 312e12)
    STANDARD_PROMPT_TOKENS = 1000 + 9 * 256
    DECODE_S_PER_TOKEN = (1 / 0.28 - STANDARD_PROMPT_TOKENS * PREFILL_S_PER_TOKEN) / 300
    TOKENS_PER_TILE = 256

    def needs(self, spec: RequestSpec) -> tuple[str, ...]:
        return ("E", "P", "D") if spec.images else ("P", "D")

    def work(self, spec: RequestSpec) -> dict[str, float]:
        tiles = sum(internvl_tiles(w, h) for w, h in spec.images)
        work = {
            "E": self.ENCODER_S_PER_TILE * tiles,
            "P": self.PREFILL_S_PER_TOKEN * (spec.text_tokens + self.TOKENS_PER_TILE * tiles),
            "D": self.DECODE_S_PER_TOKEN * spec.output_tokens,
        }
        return {c: work[c] for c in self.needs(spec)}
