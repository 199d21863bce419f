"""Work per component of a request, in seconds of one A100-80GB, from 000 Table 1.

Table 1 gives each component's maximum throughput on one A100 (batched). A component's work for a
request is `1 / throughput` at a reference request, scaled by the request's size; a replica at full
batch then serves `1 / mean work` requests/s, exactly the Table 1 number at the reference mix.
Every assumption is a named constant with its reason beside it.
"""

from __future__ import annotations

import math

from prismserve.bench.workloads import RequestSpec
from prismserve.planner.stage_batching import StageCosts, stage_budgets
from prismserve.tasklib.media_tokens import internvl_tiles

GPU_MEMORY_GB = 80.0  # the A100-80GB of 000 Table 1 and §7
RESERVED_GB = 4.0  # per GPU: CUDA context, allocator slack, activation workspace (assumption)


class CostModel:
    """Which components a request needs, and their work (A100-seconds) for it."""

    components: tuple[str, ...] = ()  # model order
    # The memory model (`memory_gb`); a model without weights has none and every option fits.
    WEIGHTS_GB: dict[str, float] = {}
    KV_BYTES_PER_TOKEN: dict[str, int] = {}

    def needs(self, spec: RequestSpec) -> tuple[str, ...]:
        """The components `spec` runs through, in model order."""
        raise NotImplementedError

    def work(self, spec: RequestSpec) -> dict[str, float]:
        """A100-seconds of each needed component for `spec`."""
        raise NotImplementedError

    def stage_costs(self) -> StageCosts | None:
        """Per-iteration latencies for trace replay (TriInfer's E/P/D models), or None."""
        return None

    def context_tokens(self, spec: RequestSpec) -> dict[str, int]:
        """Tokens each component with a KV cache holds for `spec` at its end (prompt and output)."""
        return {}

    def memory_gb(self, components: tuple[str, ...], gpus: int, batch: int, longest: dict[str, int]) -> float:
        """GB per GPU a replica of `components` needs: its weights, the KV cache of `batch` requests at
        the workload's `longest` context per component (static batches pad to the longest, and a
        paged cache must admit it), and `RESERVED_GB`; tensor parallelism splits both over `gpus`.
        Activations beyond the reserve are left out, so the model errs towards fitting."""
        weights = sum(self.WEIGHTS_GB.get(c, 0.0) for c in components)
        kv = batch * sum(self.KV_BYTES_PER_TOKEN.get(c, 0) * longest.get(c, 0) for c in components) / 1e9
        return (weights + kv) / gpus + RESERVED_GB


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
        return _omni_needs(self.components, spec, speech=("G",))

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


class QwenImageCosts(CostModel):
    """Qwen-Image (000 §7.3.3): the Qwen2.5-VL-7B text encoder (T) and the generator (G): the 20B DiT
    and the VAE decoder.

    The components are those prismserve's Qwen-Image app splits it into (`tasklib.imagegen.ImageGenTask`):
    the text encoder apart (`TextEncoderTask`) or not, the DiT and the VAE always together
    (`ImageGeneratorTask`, `models.qwen_image.QwenImage.generate`); their costs are stated apart
    (`DIT_S_PER_TOKEN`, `VAE_DECODE_S`). Every request is 000 §7.3.3's: one 512x512 image, 20 denoising steps, a
    prompt of `text_tokens` tokens. Table 1 (one A100): text in/out 15.67 req/s, image output 0.20.
    Assumptions:
    - Both Table 1 rates are at footnote 2's 1,000 input text tokens.
    - Text encoding is one prefill of the prompt (compute-bound): its work scales with the tokens.
    - No negative prompt (the workload's requests name none), so the encoder runs once per request.
    - The DiT is a dual-stream MMDiT whose blocks carry the prompt's tokens beside the image's
      (512 / 16 = 32 x 32 = 1024 latent patches): its work scales with image + prompt tokens, the
      attention's quadratic part left out (at these lengths the 20B DiT's projections dominate).
    - The VAE decode of one 512x512 image: 0.1 s (an SD-class decoder is ~1.2 TFLOP there, but its
      full-resolution convolutions are memory-bound); 2 % of the generator's 5 s, so the plan does not
      hinge on it. It is taken out of Table 1's 1 / 0.20 s, the rest being the DiT's.
    """

    components = ("T", "G")
    TABLE1 = {"T": 15.67, "G": 0.20}  # text encoder and image generator (DiT + VAE), req/s on one A100
    REFERENCE_PROMPT_TOKENS = 1000  # 000 footnote 2's input text tokens, at which Table 1 was measured
    IMAGE_TOKENS = (512 // 16) ** 2  # 000 §7.3.3's 512x512 image: VAE 8x, then 2x2 patches
    VAE_DECODE_S = 0.1
    ENCODER_S_PER_TOKEN = 1 / TABLE1["T"] / REFERENCE_PROMPT_TOKENS
    DIT_S_PER_TOKEN = (1 / TABLE1["G"] - VAE_DECODE_S) / (IMAGE_TOKENS + REFERENCE_PROMPT_TOKENS)
    HIDDEN = 3584  # Qwen2.5-VL-7B's hidden size: the conditioning is [prompt tokens, 3584] float32

    def needs(self, spec: RequestSpec) -> tuple[str, ...]:
        return self.components

    def work(self, spec: RequestSpec) -> dict[str, float]:
        return {
            "T": self.ENCODER_S_PER_TOKEN * spec.text_tokens,
            "G": self.DIT_S_PER_TOKEN * (self.IMAGE_TOKENS + spec.text_tokens) + self.VAE_DECODE_S,
        }

    @classmethod
    def conditioning_bytes(cls, prompt_tokens: int) -> int:
        """What the text encoder hands the generator for a prompt (`QwenImage.encode_prompt`)."""
        return prompt_tokens * cls.HIDDEN * 4


class Llava15Costs(CostModel):
    """LLaVA-1.5-7B (TriInfer, paper 004): CLIP ViT-L/14-336 encoder (E), Vicuna-7B prefill (P) and decode (D),
    on one NVIDIA H20 per instance (004 §5.1: 141 GB, fp16, no CUDA graphs). Times are H20-seconds.

    The paper's figures are plots without tables, so the latency model is a roofline fitted to what
    its text states about them, and every constant below is an assumption:
    - Figure 3 (LLaVA-1.5-7B, 336x336 images = 576 tokens, prompts of 1024 tokens): the encoder
      saturates at a batch of about 6 images — `encode_fixed_s` equal to about one image's work
      (5 ms + 4.7 ms/image: 2 · 0.3e9 params · 577 tokens at ~50 % of the H20's 148 TFLOP/s fp16)
      gives 6 images 85 % of the asymptotic rate; prefill saturates with one request — 0.15 ms per
      token (2 · 6.7e9 FLOPs at ~60 % of peak), so 1024 tokens are compute-bound; decode grows
      about linearly to a batch of ~512 — each step reads the 13.5 GB of weights (4.2 ms at ~80 % of
      4 TB/s) plus 0.524 MB of KV per cached token (32 layers · 2 · 4096 · fp16).
    - Table 5: SLOs for LLaVA-1.5-7B on every dataset: TTFT 4 s, TBT 0.08 s; α = 0.5 (§4.2).
    - Table 4 / §5.5: EP migrations ~2 ms, PD ~8 ms at P95: 1 ms fixed plus bytes at 100 GB/s
      (NVLink in one node; a 1600-token KV cache is 0.84 GB, 9.4 ms).
    - KV capacity: 90 % (Algorithm 2's γ) of the 141 GB less the weights, 219,000 tokens.
    - Dual-stream encode/LLM overlap (§4.6, Figure 12): the shorter of the two costs 25 % extra.
    """

    components = ("E", "P", "D")
    IMAGE_TOKENS = 576  # LLaVA-1.5 resizes every image to 336x336 (004 §5.1)
    ENCODER_SATURATION = 6  # Figure 3: images per batch where the encoder's throughput levels off

    def stage_costs(self) -> StageCosts:
        """The instance latency model the replay and the stage-level budgets use."""
        return StageCosts(
            image_tokens=self.IMAGE_TOKENS,
            encode_fixed_s=0.005,
            encode_image_s=0.0047,
            step_fixed_s=0.003,
            weights_s=0.0042,
            kv_token_s=0.524e6 / (0.8 * 4.0e12),
            token_s=0.00015,
            overlap_penalty=0.25,
            image_token_bytes=4096 * 2,
            kv_token_bytes=524288,
            link_bytes_s=100e9,
            migrate_fixed_s=0.001,
            kv_capacity_tokens=219_000,
            ttft_s=4.0,
            tbt_s=0.08,
        )

    def needs(self, spec: RequestSpec) -> tuple[str, ...]:
        return ("E", "P", "D") if spec.images else ("P", "D")

    def work(self, spec: RequestSpec) -> dict[str, float]:
        """H20-seconds per request at full batch: the encoder at its saturating batch, prefill at its
        α·TTFT token budget, decode at its TBT budget (the replica rates the planner sees)."""
        costs = self.stage_costs()
        images = len(spec.images)
        prefill = stage_budgets("P", costs).tokens
        decode = stage_budgets("D", costs).tokens
        per_decode = costs.llm_s(decode, decode * costs.reference_context) / decode
        work = {
            "E": costs.encode_s(self.ENCODER_SATURATION) / self.ENCODER_SATURATION * images,
            "P": costs.llm_s(prefill, 0) / prefill * (spec.text_tokens + self.IMAGE_TOKENS * images),
            "D": per_decode * max(0, spec.output_tokens - 1),
        }
        return {c: work[c] for c in self.needs(spec)}


def qwen3_image_tokens(width: int, height: int) -> int:
    """Tokens Qwen3-Omni's vision encoder makes of an image: 16-px patches merged 2x2, one per 32x32 pixels."""
    return math.ceil(width / 32) * math.ceil(height / 32)


class Qwen3OmniCosts(CostModel):
    """Qwen3-Omni-30B-A3B: image (I), video (V), audio (A) encoders, the thinker (L, a 30B MoE with 3B
    active), the talker (T, a 3B MoE with its multi-token-prediction module) and Code2Wav (C).

    000 Table 1 has no Qwen3-Omni row, so the work is derived from Qwen2.5-Omni's measured row
    (`QwenOmniCosts`, the same A100 and reference request) scaled by the architecture (Qwen3-Omni
    technical report, 000 ref [45]). Assumptions, each a constant below:
    - Vision encoder 0.54B vs Qwen2.5-Omni's 0.67B, 4 patches per token in both: image and video work
      x `VISION_RATIO` per token; audio encoder (AuT, 0.6B) about Whisper's encoder: x 1.
    - Thinker: prefill and decode compute follow active parameters, 3.3B vs Qwen2.5-Omni's 7.6B, at
      `MOE_EFFICIENCY` of a dense model's speed (grouped expert matmuls, routing): x 0.87.
    - Talker: sequential decode steps — `SPEECH_S_PER_TEXT_TOKEN` of speech per output token, codec
      frames at 12.5 Hz, 16 codebooks per frame (one talker step and 15 MTP steps), each batched step
      `DECODE_STEP_S` (a small model's decode step is launch-bound) shared by `TALKER_BATCH` requests.
    - Code2Wav: a causal ConvNet, one pass per chunk: `CODE2WAV_S_PER_AUDIO_S` per second of speech.
    Memory (`memory_gb`): bf16 weights and per-token KV of the thinker (48 layers, 4 KV heads of 128)
    and the talker; contexts count video and audio clips as 000 Table 1's footnote 2 sizes them.
    """

    components = ("I", "V", "A", "L", "T", "C")
    BASE = QwenOmniCosts
    VISION_RATIO = 0.54 / 0.67
    MOE_EFFICIENCY = 0.5
    THINKER_RATIO = (3.3 / 7.6) / MOE_EFFICIENCY
    SPEECH_S_PER_TEXT_TOKEN = 0.3  # ~150 spoken words per minute, ~1.3 tokens per word
    CODEC_FRAME_HZ = 12.5
    STEPS_PER_FRAME = 16
    DECODE_STEP_S = 0.008
    TALKER_BATCH = 8  # the catalog's decoder batch
    CODE2WAV_S_PER_AUDIO_S = 0.02  # ~50x real time at full batch
    VIDEO_TOKENS = 10_000  # 000 Table 1 footnote 2
    AUDIO_TOKENS = 200  # 000 Table 1 footnote 2
    WEIGHTS_GB = {"I": 1.1, "V": 1.1, "A": 1.3, "L": 61.0, "T": 6.6, "C": 0.4}  # bf16: 2 bytes per parameter
    KV_BYTES_PER_TOKEN = {"L": 2 * 48 * 4 * 128 * 2, "T": 2 * 20 * 2 * 128 * 2}  # K and V, bf16

    def needs(self, spec: RequestSpec) -> tuple[str, ...]:
        return _omni_needs(self.components, spec, speech=("T", "C"))

    def speech_s(self, spec: RequestSpec) -> float:
        """Seconds of speech the talker says for `spec` (0 without audio output)."""
        return spec.output_tokens * self.SPEECH_S_PER_TEXT_TOKEN if spec.audio_out else 0.0

    def work(self, spec: RequestSpec) -> dict[str, float]:
        base = {c: 1.0 / rate for c, rate in self.BASE.THROUGHPUT.items()}
        image_s_per_token = base["I"] / self.BASE.REFERENCE_IMAGE_TOKENS * self.VISION_RATIO
        frames = self.speech_s(spec) * self.CODEC_FRAME_HZ
        work = {
            "I": image_s_per_token * sum(qwen3_image_tokens(w, h) for w, h in spec.images),
            "V": base["V"] * self.VISION_RATIO * spec.videos,
            "A": base["A"] * spec.audios,
            "L": base["L"] * self.THINKER_RATIO * spec.output_tokens / self.BASE.REFERENCE_OUTPUT_TOKENS,
            "T": frames * self.STEPS_PER_FRAME * self.DECODE_STEP_S / self.TALKER_BATCH,
            "C": self.speech_s(spec) * self.CODE2WAV_S_PER_AUDIO_S,
        }
        return {c: work[c] for c in self.needs(spec)}

    def context_tokens(self, spec: RequestSpec) -> dict[str, int]:
        prompt = (
            spec.text_tokens
            + sum(qwen3_image_tokens(w, h) for w, h in spec.images)
            + self.VIDEO_TOKENS * spec.videos
            + self.AUDIO_TOKENS * spec.audios
        )
        frames = math.ceil(self.speech_s(spec) * self.CODEC_FRAME_HZ)
        return {"L": prompt + spec.output_tokens, "T": spec.output_tokens + frames}


class Qwen25VLCosts(CostModel):
    """Qwen2.5-VL-32B: the vision encoder (E, 0.67B), the LLM's prefill (P) and decode (D).

    Table 1 (one A100): image input 12.04 req/s, text in/out 0.32 req/s. Assumptions, as for
    `InternVL3Costs` (whose LLM, Qwen2.5-32B, is the same):
    - Both are at 000 Table 3's Standard workload: one 1920x1080 image (2691 tokens of 28x28 pixels;
      the ViT's FLOPs there, 2 · 0.67e9 · 4 patches · 2691, take ~0.09 s at 50 % of peak: ~11 req/s,
      where footnote 2's 600-token image would give ~50), 1000 text tokens in, 300 out.
    - Encoder work scales with image tokens, prefill with prompt tokens at InternVL3's FLOP rate;
      decode is the rest of 1 / 0.32 s over 300 tokens (Table 1's gap to InternVL3's 0.28 for the
      same LLM thus lands on decode, where the KV room next to the encoder differs).
    - Video (Table 1: 0.89 req/s) is not modelled: the ServeGen trace used here has images only.
    """

    components = ("E", "P", "D")
    STANDARD_IMAGE_TOKENS = qwen_image_tokens(1920, 1080)
    ENCODER_S_PER_TOKEN = 1 / 12.04 / STANDARD_IMAGE_TOKENS
    PREFILL_S_PER_TOKEN = InternVL3Costs.PREFILL_S_PER_TOKEN
    STANDARD_PROMPT_TOKENS = 1000 + STANDARD_IMAGE_TOKENS
    DECODE_S_PER_TOKEN = (1 / 0.32 - STANDARD_PROMPT_TOKENS * PREFILL_S_PER_TOKEN) / 300

    def needs(self, spec: RequestSpec) -> tuple[str, ...]:
        return ("E", "P", "D") if spec.images else ("P", "D")

    def work(self, spec: RequestSpec) -> dict[str, float]:
        tokens = sum(qwen_image_tokens(w, h) for w, h in spec.images)
        work = {
            "E": self.ENCODER_S_PER_TOKEN * tokens,
            "P": self.PREFILL_S_PER_TOKEN * (spec.text_tokens + tokens),
            "D": self.DECODE_S_PER_TOKEN * spec.output_tokens,
        }
        return {c: work[c] for c in self.needs(spec)}


def _omni_needs(components: tuple[str, ...], spec: RequestSpec, speech: tuple[str, ...]) -> tuple[str, ...]:
    """The components an Omni request passes: the encoders of its inputs, the LLM, and the `speech`
    components when it asks for audio."""
    present = {"I": bool(spec.images), "V": spec.videos > 0, "A": spec.audios > 0, "L": True}
    present |= dict.fromkeys(speech, spec.audio_out)
    return tuple(c for c in components if present[c])
