"""The sim backend: per-input work scales service time; continuous batching shares the engine."""

from __future__ import annotations

import asyncio
import time

import pytest

from prismserve.executors.base import deadline_priority
from prismserve.executors.sim import SimExecutor, SimProfile
from prismserve.task import TaskInput, TaskOutput, UnitTask
from prismserve.task.context import RequestContext, use_request


class WorkInput(TaskInput):
    sim_work: float = 1.0


class Done(TaskOutput):
    ok: bool = True


class Timed(UnitTask[WorkInput, Done]):
    executor_kind = "sim"


async def finish_times(profile: SimProfile, works: list[float]) -> list[float]:
    executor = SimExecutor(Timed(), profile)
    start = time.perf_counter()

    async def one(work: float) -> float:
        await executor.run(WorkInput(sim_work=work))
        return time.perf_counter() - start

    return await asyncio.gather(*(one(w) for w in works))


def test_a_batch_takes_the_mean_work_of_its_inputs():
    profile = SimProfile(latency_s=0.1, batch_growth=0.5, max_batch=2)
    times = asyncio.run(finish_times(profile, [1.0, 3.0]))
    # One batch of 2, mean work 2: 0.1 * 2 * (1 + 0.5) = 0.3 s, both done together.
    assert times[0] == pytest.approx(0.3, abs=0.08) and times[1] == pytest.approx(times[0], abs=0.02)


def test_a_cpu_encoders_batch_spends_every_items_cpu_where_its_growth_says():
    """A CPU encoder computes each image of a batch, so its batch's CPU grows faster than its
    seconds (`cpu_growth`); the batch lasts at least its CPU. Before, the sim spent `cpu_share` of
    the batch's seconds whatever the batch: 4 images here spent 0.04 s of CPU, not 0.1."""
    profile = SimProfile(latency_s=0.05, batch_growth=0.2, max_batch=4, cpu_share=0.5, cpu_growth=1.0)
    cpu = time.process_time()
    times = asyncio.run(finish_times(profile, [1.0] * 4))
    # One batch of 4: CPU 0.05 * 0.5 * 4 = 0.1 s, beyond its 0.05 * 1.6 = 0.08 s.
    assert time.process_time() - cpu == pytest.approx(0.1, abs=0.02)
    assert min(times) >= 0.1
    # Without `cpu_growth` the CPU grows as the seconds: 0.08 * 0.5.
    cpu = time.process_time()
    asyncio.run(finish_times(profile.model_copy(update={"cpu_growth": None}), [1.0] * 4))
    assert time.process_time() - cpu == pytest.approx(0.04, abs=0.015)


def test_continuous_batching_lets_short_requests_leave_early():
    profile = SimProfile(latency_s=0.1, batch_growth=1.0, max_batch=2, continuous=True)
    short, long_, queued = asyncio.run(finish_times(profile, [1.0, 3.0, 1.0]))
    # Two share the engine at half speed each: the short one needs 0.1 s alone, so 0.2 s.
    assert short == pytest.approx(0.2, abs=0.06)
    # Then the queued one joins: both at half speed; it needs 0.1 s alone -> done at 0.4 s.
    assert queued == pytest.approx(0.4, abs=0.08)
    # The long one: 0.1 s of its 0.3 s by 0.2, 0.1 more by 0.4, the last 0.1 alone: 0.5 s.
    assert long_ == pytest.approx(0.5, abs=0.08)


class RankedInput(TaskInput):
    sim_work: float = 1.0
    sim_priority: int = 0


class Ranked(UnitTask[RankedInput, Done]):
    executor_kind = "sim"


@pytest.mark.parametrize("continuous", [False, True])
def test_waiting_requests_further_along_their_path_are_served_first(continuous):
    """Work in progress first: a request at a later hop (higher `sim_priority`) that arrives while
    others wait is served before them, so a replica that is both a path's first and a later hop
    does not queue the requests an upstream executor already served behind new arrivals."""
    executor = SimExecutor(Ranked(), SimProfile(latency_s=0.05, max_batch=1, continuous=continuous))
    order: list[str] = []

    async def one(name: str, priority: int, delay: float) -> None:
        await asyncio.sleep(delay)
        await executor.run(RankedInput(sim_priority=priority))
        order.append(name)

    async def scenario() -> None:
        await asyncio.gather(
            one("first", 0, 0.0), one("new 1", 0, 0.01), one("new 2", 0, 0.01), one("continuing", 1, 0.02)
        )

    asyncio.run(scenario())
    assert order == ["first", "continuing", "new 1", "new 2"]


class TokenInput(TaskInput):
    tokens: int

    def pending_tokens(self) -> int:
        return self.tokens


class Tokened(UnitTask[TokenInput, Done]):
    executor_kind = "sim"


def test_service_time_follows_the_tokens_an_input_carries():
    executor = SimExecutor(Tokened(), SimProfile(token_s=0.001, max_batch=1))

    async def took(tokens: int) -> float:
        start = time.perf_counter()
        await executor.run(TokenInput(tokens=tokens))
        return time.perf_counter() - start

    assert asyncio.run(took(200)) == pytest.approx(0.2, abs=0.06)
    assert asyncio.run(took(20)) == pytest.approx(0.02, abs=0.03)


@pytest.mark.parametrize("continuous", [False, True])
def test_waiting_calls_are_served_by_slack_to_their_deadline(continuous):
    """SLO scheduling: among waiting calls the one with the least slack (deadline less its own
    service time) goes first, whatever the arrival order and `sim_priority`; calls without a
    deadline wait behind those with one."""
    executor = SimExecutor(Tokened(), SimProfile(token_s=0.001, max_batch=1, continuous=continuous))
    order: list[str] = []

    async def one(name: str, tokens: int, deadline_in: float | None, delay: float) -> None:
        await asyncio.sleep(delay)
        with use_request(RequestContext(deadline=None if deadline_in is None else time.time() + deadline_in)):
            await executor.run(TokenInput(tokens=tokens))
        order.append(name)

    async def scenario() -> None:
        await asyncio.gather(
            one("running", 50, None, 0.0),
            one("no slo", 10, None, 0.01),
            one("long, loose", 400, 5.0, 0.01),  # slack 5 - 0.4
            one("short, tight", 10, 0.5, 0.02),  # slack 0.5 - 0.01
            one("long, due soon", 400, 0.8, 0.02),  # slack 0.8 - 0.4: least
        )

    asyncio.run(scenario())
    assert order == ["running", "long, due soon", "short, tight", "long, loose", "no slo"]


def test_an_engines_priority_is_its_calls_deadline_and_calls_without_one_come_last():
    """What vLLM's `priority` policy orders by (smaller first): the deadline in milliseconds."""

    def priority(deadline: float | None) -> int:
        with use_request(RequestContext(deadline=deadline)):
            return deadline_priority()

    now = time.time()
    assert priority(now + 0.5) < priority(now + 2.0) < priority(None)
    assert priority(now + 0.5) - priority(now) == 500
