"""A stage's figures from its calls' streams (runtime/stage_stats.py), as the dispatcher sees them."""

from __future__ import annotations

import time

from prismserve.protocol.chat import TextDelta
from prismserve.runtime.stage_stats import BUCKETS, StageStats


def test_a_text_stream_gives_time_to_first_token_time_per_output_token_and_token_counts():
    stats = StageStats()
    watch = stats.watch(time.perf_counter() - 0.2)  # sent 200 ms ago
    watch.item(TextDelta(text="a", tokens=1))
    time.sleep(0.05)
    watch.item(TextDelta(text="bc", tokens=2))  # a delta may carry several tokens
    watch.item(TextDelta(text="d"))  # not counted by its engine: one
    watch.item(TextDelta(finish_reason="stop", prompt_tokens=7))
    watch.done()
    assert (stats.prompt_tokens, stats.generation_tokens) == (7, 4)
    assert stats.time_to_first_token.count == 1 and 0.2 <= stats.time_to_first_token.sum < 0.3
    # 50+ ms over the 3 tokens after the first
    assert stats.time_per_output_token.count == 1 and 0.05 / 3 <= stats.time_per_output_token.sum < 0.1
    assert stats.time_to_first_audio.count == 0


def test_audio_is_timed_to_its_first_chunk_and_other_items_are_not_timed():
    stats = StageStats()
    watch = stats.watch(time.perf_counter())
    watch.item({"hidden": [0.1]})  # a thinker's hidden states: neither text nor audio
    watch.item(b"\x00\x01" * 100)
    watch.item(b"\x00\x01" * 100)
    watch.done()
    assert stats.time_to_first_audio.count == 1 and stats.time_to_first_token.count == 0
    assert stats.generation_tokens == 0 and stats.time_per_output_token.count == 0


def test_observations_land_in_buckets_up_to_thirty_minutes():
    stats = StageStats()
    for seconds in (0.0005, 0.3, 1799.0, 5000.0):
        stats.time_to_first_token.observe(seconds)
    counts = stats.time_to_first_token.counts
    assert BUCKETS[-1] == 1800.0 and counts[0] == 1 and counts[-2] == 1 and counts[-1] == 1
    assert counts[BUCKETS.index(0.3)] == 1 and stats.time_to_first_token.count == 4
