"""Trace replay (TriInfer Algorithms 1 and 2): budgets, batches, request timing, goodput, layouts."""

from __future__ import annotations

import random

import pytest

from prismserve.planner import PlannerError
from prismserve.planner.replay import (
    Instance,
    Job,
    Replay,
    TraceRequest,
    all_layouts,
    attainment,
    goodput,
    hybrid_layout,
    layout_name,
    method_layouts,
    partition,
    read_trace,
    stage_work,
)
from prismserve.planner.stage_batching import KINDS, StageCosts, fixed_budgets, latency_limit, stage_budgets

COSTS = StageCosts(
    image_tokens=576,
    encode_fixed_s=0.005,
    encode_image_s=0.0047,
    step_fixed_s=0.003,
    weights_s=0.0042,
    kv_token_s=1.6e-7,
    token_s=0.00015,
    kv_capacity_tokens=200_000,
    ttft_s=4.0,
    tbt_s=0.08,
)


def trace(n: int = 400, seed: int = 0, output: float = 3.2) -> list[TraceRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(1.0)
        out.append(TraceRequest(t, rng.randint(20, 60), max(2, int(rng.lognormvariate(output, 0.6))), 1))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_budgets_are_the_largest_batches_within_the_kinds_latency_limit(kind):
    budgets = stage_budgets(kind, COSTS)
    limit = latency_limit(kind, COSTS)
    assert limit == (2.0 if kind in ("E", "P", "EP") else 0.08)  # α·TTFT, else TBT
    context = COSTS.reference_context if "D" in kind else 0
    n = budgets.tokens
    assert COSTS.llm_s(n, n * context) <= limit < COSTS.llm_s(n + 1, (n + 1) * context)
    m = budgets.images
    assert COSTS.encode_s(m) <= limit < COSTS.encode_s(m + 1)


def test_a_batch_takes_every_decode_then_partial_prefills_then_new_work():
    instance = Instance(0, "EPD", stage_budgets("EPD", COSTS), COSTS, dual_stream=True)
    budget = instance.budgets.tokens
    decoding = [Job(TraceRequest(0, 10, 50), 0, 10, 0, 0) for _ in range(budget + 5)]
    instance.decoding = list(decoding)
    partial = Job(TraceRequest(0, 100, 5), 0, 100, 0, 40)
    new = Job(TraceRequest(0, 100, 5), 0, 100, 0, 100)
    instance.prefilling = [partial]
    instance.new_prefills.append(new)
    decodes, chunks, encodes, _ = instance.batch(0.0)
    # All decodes, even past the token budget (Algorithm 1 lines 7-9); no room left for prefills.
    assert decodes == decoding and chunks == [] and encodes == []
    instance.decoding = decoding[: budget - 50]
    decodes, chunks, _, seconds = instance.batch(0.0)
    assert chunks == [(partial, 40), (new, 10)]  # partial first, then new work fills the budget
    kv = sum(j.context for j in instance.decoding) + 60
    assert seconds == pytest.approx(COSTS.llm_s(budget, kv))


def test_one_request_on_e_p_d_takes_each_stage_and_migration_once():
    request = TraceRequest(0.0, 40, 4, images=1)
    (job,) = Replay({"E": 1, "P": 1, "D": 1}, COSTS).run([request])
    prompt = 40 + 576
    encode = COSTS.encode_s(1)
    first = encode + COSTS.ep_migration_s(1) + COSTS.llm_s(prompt, 0)
    assert job.times["first_token"] == pytest.approx(first)
    decode_start = first + COSTS.pd_migration_s(prompt)
    steps = [COSTS.llm_s(1, prompt + k) for k in range(3)]
    assert job.times["done"] == pytest.approx(decode_start + sum(steps))
    assert job.gaps == 3 and job.over == 0


def test_an_epd_instance_encodes_and_prefills_without_migrating():
    (job,) = Replay({"EPD": 1}, COSTS).run([TraceRequest(0.0, 40, 2, images=1)])
    # Encode alone, then the 616-token prefill in chunks of the TBT budget.
    budget = stage_budgets("EPD", COSTS).tokens
    chunks = [budget, 616 - budget] if budget < 616 else [616]
    expected = COSTS.encode_s(1)
    done = 0
    for chunk in chunks:
        expected += COSTS.llm_s(chunk, done)
        done += chunk
    assert job.times["first_token"] == pytest.approx(expected)
    assert "prefill_ready" in job.times and job.times["prefill_ready"] == job.times["encode_end"]


def test_replay_is_deterministic():
    a = attainment(trace(), {"EP": 3, "D": 1}, COSTS, 6.0)
    b = attainment(trace(), {"EP": 3, "D": 1}, COSTS, 6.0)
    assert a == b


def test_stage_level_batching_keeps_tbt_where_vllms_budget_stalls_decodes():
    work = trace(output=4.5)  # ~90 output tokens: each decode overlaps many prefills
    rate = 6.0
    staged = attainment(work, {"EPD": 2}, COSTS, rate)
    fixed = attainment(work, {"EPD": 2}, COSTS, rate, stage_batching=False, dual_stream=False)
    assert staged.tbt > 0.99 and fixed.tbt < 0.7


def test_goodput_is_the_rate_where_attainment_crosses_90_percent():
    work = trace()
    layout = {"EP": 3, "D": 1}
    rate = goodput(work, layout, COSTS)
    assert rate > 0
    assert attainment(work, layout, COSTS, rate).slo >= 0.9
    assert attainment(work, layout, COSTS, rate * 1.05).slo < 0.9


def test_goodput_needs_two_requests():
    with pytest.raises(PlannerError, match="at least 2"):
        goodput(trace(1), {"EPD": 1}, COSTS)


def test_layouts_of_8_are_the_papers_35():
    layouts = all_layouts(8)
    assert len(layouts) == 35 and len({layout_name(x) for x in layouts}) == 35
    assert all(sum(x.values()) == 8 for x in layouts)


def test_algorithm_2_splits_by_stage_time_and_keeps_the_best_method():
    assert partition(8, {"E": 1.0, "P": 6.0, "D": 1.0}) == {"E": 1, "P": 6, "D": 1}
    assert partition(3, {"E": 0.0, "P": 5.0, "D": 1.0}) == {"E": 1, "P": 1, "D": 1}
    work = trace()
    split = stage_work(work, COSTS, 4)
    assert sum(split.values()) == 4 and split["P"] >= split["D"] >= 1  # prefill is the heavy stage here
    choice = hybrid_layout(work, COSTS, 4)
    assert set(choice.candidates) == {layout_name(x) for x in method_layouts(split).values()}
    assert choice.goodput == max(choice.candidates.values())
    assert choice.candidates[layout_name(choice.layout)] == choice.goodput


def test_a_layout_must_cover_every_stage():
    with pytest.raises(PlannerError, match=r"no instance for stage\(s\) \['D'\]"):
        Replay({"EP": 2}, COSTS)
    with pytest.raises(PlannerError, match="unknown instance kinds"):
        Replay({"XD": 2}, COSTS)


def test_read_trace_reads_the_workload_format(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"arrival_s": 1.5, "text_tokens": 30, "output_tokens": 7, "images": [[336, 336]]}\n'
        '{"arrival_s": 0.5, "text_tokens": 10, "output_tokens": 3}\n'
    )
    assert read_trace(path) == [TraceRequest(0.5, 10, 3, 0), TraceRequest(1.5, 30, 7, 1)]
    path.write_text('{"arrival_s": 1}\n')
    with pytest.raises(PlannerError, match="trace.jsonl:1: not a trace request"):
        read_trace(path)


def test_fixed_budgets_are_vllms_default():
    assert fixed_budgets(COSTS).tokens == 8192 and fixed_budgets(COSTS).images == 14


def test_a_trace_too_short_to_load_the_layout_has_no_goodput():
    with pytest.raises(PlannerError, match="replay a longer trace"):
        goodput(trace(20), {"EPD": 8}, COSTS)
