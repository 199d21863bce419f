"""Stage-level batching (TriInfer, paper 004 Algorithm 1): per-instance budgets from the SLOs.

An instance of kind E, P, D, EP, ED, PD or EPD runs iterations; each iteration's batch holds every
running decode, then partial chunked prefills and encodes, then new work, up to a token budget
(LLM tokens per step) and an image budget (encoder items per step). The budgets are the largest
batches whose modelled latency stays within α·TTFT on instances that do not decode (a request needs
at least an encode and a prefill iteration before its first token, hence α = 0.5) and within TBT on
instances that decode (a long step stalls every running decode).

`StageCosts` is the latency model both the budgets and the trace replay (`replay.py`) use, so the
planner needs no engine: a spec carries it (`PlanSpec.stages`) and the emulated models make it.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

KINDS = ("E", "P", "D", "EP", "ED", "PD", "EPD")  # instance kinds: the stages an instance runs
FIRST_TOKEN_KINDS = frozenset({"E", "EP", "P"})  # Algorithm 1 line 1: bounded by α·TTFT


class StageCosts(BaseModel):
    """The latency of one instance's iteration (one GPU), and the SLOs, for replay and budgets.

    Encoder batch of n images: `encode_fixed_s + encode_image_s · n`. LLM step of t tokens reading
    k KV-cache tokens: `step_fixed_s + max(weights_s + kv_token_s · k, token_s · t)` — a roofline:
    memory-bound (weights and KV reads) for decode-sized steps, compute-bound for prefill chunks.
    An instance holding the encoder and the LLM runs them on two streams (TriInfer §4.2
    dual-stream): the step takes `max(e, l) + overlap_penalty · min(e, l)`; without dual streams
    (vLLM), `e + l`. Migrations take `migrate_fixed_s` plus their bytes over `link_bytes_s`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    image_tokens: int = Field(ge=1)  # LLM tokens per image
    encode_fixed_s: float = Field(ge=0)
    encode_image_s: float = Field(gt=0)
    step_fixed_s: float = Field(ge=0)
    weights_s: float = Field(ge=0)
    kv_token_s: float = Field(ge=0)
    token_s: float = Field(gt=0)
    overlap_penalty: float = Field(default=0.25, ge=0, le=1)
    image_token_bytes: int = Field(default=8192, ge=0)
    kv_token_bytes: int = Field(default=524288, ge=0)
    link_bytes_s: float = Field(default=100e9, gt=0)
    migrate_fixed_s: float = Field(default=0.001, ge=0)
    kv_capacity_tokens: int = Field(ge=1)  # KV-cache tokens one LLM instance holds
    ttft_s: float = Field(gt=0)
    tbt_s: float = Field(gt=0)
    alpha: float = Field(default=0.5, gt=0, le=1)
    reference_context: int = Field(default=1024, ge=0)  # KV tokens per decode when searching budgets
    fixed_token_budget: int = Field(default=8192, ge=1)  # vLLM's max_num_batched_tokens (no stage batching)

    def encode_s(self, images: int) -> float:
        """Seconds an encoder batch of `images` takes (0 for none)."""
        return self.encode_fixed_s + self.encode_image_s * images if images else 0.0

    def llm_s(self, tokens: int, kv_tokens: int) -> float:
        """Seconds an LLM step of `tokens` new tokens reading `kv_tokens` cached ones takes (0 for none)."""
        if not tokens:
            return 0.0
        return self.step_fixed_s + max(self.weights_s + self.kv_token_s * kv_tokens, self.token_s * tokens)

    def step_s(self, images: int, tokens: int, kv_tokens: int, dual_stream: bool = True) -> float:
        """Seconds one iteration takes: the encoder batch and the LLM step, overlapped on dual streams."""
        e, llm = self.encode_s(images), self.llm_s(tokens, kv_tokens)
        if dual_stream:
            return max(e, llm) + self.overlap_penalty * min(e, llm)
        return e + llm

    def ep_migration_s(self, images: int) -> float:
        """Seconds to move `images` images' encoder outputs (the image cache) to a prefill instance."""
        return self.migrate_fixed_s + images * self.image_tokens * self.image_token_bytes / self.link_bytes_s

    def pd_migration_s(self, tokens: int) -> float:
        """Seconds to move `tokens` tokens of KV cache to a decode instance."""
        return self.migrate_fixed_s + tokens * self.kv_token_bytes / self.link_bytes_s


class InstanceBudgets(BaseModel):
    """An instance's per-iteration limits: LLM tokens and encoder images."""

    model_config = ConfigDict(frozen=True)

    tokens: int
    images: int


def largest_within(latency: Callable[[int], float], limit: float, ceiling: int = 1 << 20) -> int:
    """The largest n ≥ 1 with `latency(n) ≤ limit`, by binary search (latency grows with n); 1 when
    even one item is over (an instance must make progress)."""
    lo, hi = 1, ceiling
    if latency(lo) > limit:
        return 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if latency(mid) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def latency_limit(kind: str, costs: StageCosts) -> float:
    """Algorithm 1 lines 1-4: α·TTFT for instances that do not decode, TBT for those that do."""
    return costs.alpha * costs.ttft_s if kind in FIRST_TOKEN_KINDS else costs.tbt_s


def stage_budgets(kind: str, costs: StageCosts) -> InstanceBudgets:
    """Algorithm 1 line 5: the token and image budgets of an instance of `kind`, searched on the
    modelled batch latency (decode-bearing instances at `reference_context` KV tokens per token)."""
    if kind not in KINDS:
        raise ValueError(f"unknown instance kind {kind!r}; kinds are {', '.join(KINDS)}")
    limit = latency_limit(kind, costs)
    context = costs.reference_context if "D" in kind else 0
    tokens = largest_within(lambda n: costs.llm_s(n, n * context), limit)
    images = largest_within(costs.encode_s, limit)
    return InstanceBudgets(tokens=tokens, images=images)


def fixed_budgets(costs: StageCosts) -> InstanceBudgets:
    """InstanceBudgets without stage-level batching (vLLM's defaults): `fixed_token_budget` tokens per step,
    and as many images as that many encoder tokens."""
    tokens = costs.fixed_token_budget
    return InstanceBudgets(tokens=tokens, images=max(1, tokens // costs.image_tokens))
