"""What each stage (deployment) did, as the dispatcher sees its calls: the figures vLLM's metrics
give per engine — requests running and waiting, prompt and generated tokens, time to first token,
time per output token — for every stage, and time to first audio for stages that stream audio.

Kept as plain counts and histogram buckets (no Prometheus in the runtime); the gateway exports them
(`gateway/metrics.py`). Times are measured where the gateway receives the stage's stream, so they
include the transport, as a client of that stage would see them.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any

# Seconds, from 1 ms to 30 minutes: long generations and queues under overload fit in the last ones.
BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 1800.0,
)  # fmt: skip


@dataclass
class Histogram:
    """Observations counted per bucket (upper bounds `BUCKETS`, then +Inf), with their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    sum: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass
class StageStats:
    """One deployment's counts since the runtime started."""

    waiting: int = 0  # calls waiting for a replica to be up (none running, restarts or new cells)
    prompt_tokens: int = 0  # as the engine reported them (a stream's last text delta)
    generation_tokens: int = 0
    time_to_first_token: Histogram = field(default_factory=Histogram)
    time_per_output_token: Histogram = field(default_factory=Histogram)  # per call, after the first
    time_to_first_audio: Histogram = field(default_factory=Histogram)

    def watch(self, sent_at: float) -> StreamWatch:
        """A watch over one call's output stream, sent at `sent_at` (`time.perf_counter()`)."""
        return StreamWatch(self, sent_at)


@dataclass
class StreamWatch:
    """Times and counts the items of one call's stream as they arrive; `done` records the call."""

    stats: StageStats
    sent_at: float
    first_at: float | None = None
    last_at: float = 0.0
    tokens: int = 0
    first_tokens: int = 0

    def item(self, item: Any) -> None:
        now = time.perf_counter()
        if isinstance(item, (bytes, bytearray)):  # audio (a vocoder's PCM)
            if self.first_at is None:
                self.first_at = now
                self.stats.time_to_first_audio.observe(now - self.sent_at)
            return
        tokens = 1 if isinstance(item, str) else getattr(item, "tokens", None)  # a str: one piece
        if tokens is None:  # neither text nor audio: not timed
            return
        if not tokens and getattr(item, "text", None):  # text the engine did not count: one token
            tokens = 1
        if self.first_at is None:
            self.first_at, self.first_tokens = now, tokens
            self.stats.time_to_first_token.observe(now - self.sent_at)
        self.last_at = now
        self.tokens += tokens
        prompt = getattr(item, "prompt_tokens", None)
        if prompt:
            self.stats.prompt_tokens += prompt

    def done(self) -> None:
        self.stats.generation_tokens += self.tokens
        later = self.tokens - self.first_tokens
        if self.first_at is not None and later > 0:
            self.stats.time_per_output_token.observe((self.last_at - self.first_at) / later)
