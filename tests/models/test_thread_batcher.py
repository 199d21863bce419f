"""`ThreadBatcher` runs the most urgent waiting work first, and `Playout` says when a listener needs
more audio (the deadlines vocoder streams pass to it)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from prismserve.models.base import Playout, ThreadBatcher


def test_waiting_calls_run_by_deadline_each_batch_one_key():
    """While a batch runs, calls queue; the next batch is the key of the earliest deadline (not the
    oldest call), with that key's other waiting calls."""
    running, release, order = threading.Event(), threading.Event(), []

    def handler(key, items):
        if key == "first":
            running.set()
            release.wait(10)
        order.append((key, sorted(items)))
        return items

    batcher = ThreadBatcher(handler, max_batch=8)
    now = time.monotonic()
    calls = [("late", 1, now + 30), ("soon", 2, now + 1), ("late", 3, now + 20), ("soon", 4, now + 2)]
    with ThreadPoolExecutor(5) as pool:
        blocker = pool.submit(batcher, "first", 0)
        assert running.wait(10)
        futures = []
        for key, item, deadline in calls:  # queued in this order while "first" runs
            futures.append(pool.submit(batcher, key, item, deadline))
            time.sleep(0.05)
        release.set()
        assert [f.result(10) for f in futures] == [1, 2, 3, 4] and blocker.result(10) == 0
    assert order == [("first", [0]), ("soon", [2, 4]), ("late", [1, 3])]


def test_without_deadlines_the_oldest_call_goes_first():
    running, release, order = threading.Event(), threading.Event(), []

    def handler(key, items):
        if key == "first":
            running.set()
            release.wait(10)
        order.append(key)
        return items

    batcher = ThreadBatcher(handler)
    with ThreadPoolExecutor(4) as pool:
        pool.submit(batcher, "first", 0)
        assert running.wait(10)
        for key in ("b", "a", "c"):
            pool.submit(batcher, key, 1)
            time.sleep(0.05)
        release.set()
    assert order == ["first", "b", "a", "c"]


def test_a_listener_needs_audio_now_before_the_first_and_then_as_the_audio_plays():
    playout = Playout(rate=24_000)
    before = time.monotonic()
    assert before <= playout.deadline() <= time.monotonic()  # nothing handed out: needed at once
    playout.handed_out(0)
    assert playout.started is None
    playout.handed_out(12_000)  # half a second
    started = playout.started
    assert started is not None and before <= started <= time.monotonic()
    playout.handed_out(36_000)  # two seconds in all
    assert playout.deadline() == started + 2.0
