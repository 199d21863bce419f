"""Cells (000 §4.3): Algorithm 1, mixtures for a target and for a budget, re-planning."""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from collections import Counter

import pytest
from planner_instances import cells_from, exhaustive, random_cells, random_spec

from prismserve.planner import (
    MAX_PLAN_GPUS,
    InfeasibleError,
    budget_mixture,
    build_model,
    greedy_mixture,
    load_plan,
    make_plan,
    max_throughput,
    mixture_for_budget,
    mixture_for_target,
    mixture_throughput,
    parse_spec,
    plan_cells,
    plan_changes,
    plan_for_budget,
    plan_for_target,
    replan,
)


def gpus_of(mix: Counter) -> int:
    return sum(size * count for size, count in mix.items())


def test_the_greedy_counterexample_from_the_notes():
    cells = cells_from([(1, 1.0), (2, 2.5), (4, 6.0)])
    assert mixture_for_target(cells, 5.5) == Counter({4: 1})
    greedy = greedy_mixture(cells, 5.5)
    assert greedy == Counter({2: 2, 1: 1}) and gpus_of(greedy) == 5  # the paper's Algorithm 2


def exhaustive_fewest_gpus(cells, target: float) -> int:
    bound = [int(target / c.throughput) + 1 for c in cells]
    return min(
        sum(c.gpus * n for c, n in zip(cells, counts, strict=True))
        for counts in itertools.product(*(range(b + 1) for b in bound))
        if sum(c.throughput * n for c, n in zip(cells, counts, strict=True)) >= target - 1e-9
    )


def test_mixture_for_target_equals_exhaustive_search_over_cell_counts():
    rng = random.Random(11)
    beaten = 0
    for _ in range(300):
        cells = random_cells(rng)
        if len(cells) > 4:
            cells = cells[:4]
        target = rng.uniform(0.1, 60)
        mix = mixture_for_target(cells, target)
        assert mixture_throughput(cells, mix) >= target - 1e-9
        assert gpus_of(mix) == exhaustive_fewest_gpus(cells, target)
        greedy = gpus_of(greedy_mixture(cells, target))
        assert gpus_of(mix) <= greedy
        beaten += gpus_of(mix) < greedy
    assert beaten > 0  # the paper's greedy is beaten on some instances


def test_mixture_for_100000_gpus_is_fast_and_exact_in_its_remainder():
    cells = cells_from([(1, 1.0), (2, 2.5), (4, 6.0), (8, 12.5), (16, 26.0), (32, 53.0), (64, 108.0)])
    target = 1562 * 108.0 + 5.5  # ~100,000 GPUs of the largest cell plus the counterexample's remainder
    start = time.perf_counter()
    mix = mixture_for_target(cells, target)
    elapsed = time.perf_counter() - start
    assert mix == Counter({64: 1562, 4: 1})  # the greedy would end on 2 + 2 + 1 GPUs
    assert gpus_of(greedy_mixture(cells, target)) == 1562 * 64 + 5
    assert mixture_throughput(cells, mix) >= target
    assert elapsed < 0.05  # the budget is 10 ms; this machine is shared, so the test allows 5x


def test_binary_decomposition_equals_an_exhaustive_knapsack():
    rng = random.Random(5)
    for _ in range(300):
        cells = random_cells(rng)
        budget = rng.randint(cells[0].gpus, 150)
        mix = mixture_for_budget(cells, budget)
        assert gpus_of(mix) <= budget
        best = [0.0] * (budget + 1)
        for capacity in range(1, budget + 1):
            best[capacity] = max(
                [best[capacity - 1]]
                + [best[capacity - c.gpus] + c.throughput for c in cells if c.gpus <= capacity]
            )
        assert mixture_throughput(cells, mix) == pytest.approx(best[budget])


def test_budget_below_the_smallest_cell_is_infeasible():
    with pytest.raises(InfeasibleError, match=r"budget of 1 GPUs is below the smallest cell \(2 GPUs\)"):
        mixture_for_budget(cells_from([(2, 3.0)]), 1)


def single(component_gpus: int, throughput: float) -> dict:
    return {
        "components": ["L"],
        "options": [{"name": "L", "components": ["L"], "gpus": component_gpus, "throughput": throughput}],
        "request_types": [{"name": "text", "components": ["L"], "share": 1.0}],
    }


def test_algorithm_1_drops_sizes_without_an_instance_and_inefficient_sizes():
    cells = plan_cells(build_model(parse_spec(single(2, 5.0))), 3)
    # 1 GPU holds no replica (dropped, not compared against 0); 4 and 8 GPUs only repeat the 2-GPU cell.
    assert [(c.gpus, c.throughput) for c in cells] == [(2, 5.0)]
    assert plan_for_budget(parse_spec(single(2, 5.0)), 7, 3).model_dump()["cells"] == [
        {"gpus": 2, "throughput": 5.0, "count": 3, "replicas": {"L": 2 // 2}, "node": None}
    ]


def test_algorithm_1_keeps_a_size_that_beats_copies_of_the_last_kept_cell():
    # E on 1 GPU, L needs 2: 1 GPU is empty; 2 GPUs can't hold both; 4 GPUs hold E + L.
    spec = parse_spec(
        {
            "components": ["E", "L"],
            "options": [
                {"name": "E", "components": ["E"], "gpus": 1, "throughput": 8.0},
                {"name": "L", "components": ["L"], "gpus": 2, "throughput": 3.0},
                {"name": "EL", "components": ["E", "L"], "gpus": 2, "throughput": 2.0},
            ],
            "request_types": [{"name": "image", "components": ["E", "L"], "share": 1.0}],
        }
    )
    model = build_model(spec)
    cells = plan_cells(model, 4)
    sizes = [c.gpus for c in cells]
    assert sizes[0] == 2 and cells[0].throughput == pytest.approx(2.0)  # the 2-GPU monolith
    for small, large in zip(cells, cells[1:], strict=False):
        assert large.throughput / large.gpus > small.throughput / small.gpus
    for cell in cells:
        assert cell.throughput == pytest.approx(max_throughput(model, cell.gpus).throughput)
        assert cell.solution.gpus <= cell.gpus


def test_replanning_keeps_identical_cells_and_reports_what_to_add_and_remove():
    spec = parse_spec(
        {
            "components": ["E", "L"],
            "options": [
                {"name": "E", "components": ["E"], "gpus": 1, "throughput": 20.0},
                {"name": "L", "components": ["L"], "gpus": 1, "throughput": 6.0},
                {"name": "EL", "components": ["E", "L"], "gpus": 1, "throughput": 4.0},
            ],
            "request_types": [
                {"name": "text", "components": ["L"], "share": 0.3},
                {"name": "image", "components": ["E", "L"], "share": 0.7},
            ],
        }
    )
    current = plan_for_target(spec, 30.0)  # one 4-GPU cell and three 1-GPU monoliths
    assert [(c.gpus, c.count) for c in current.cells] == [(4, 1), (1, 3)]
    result = replan(spec, current, 40.0)
    assert [(c.gpus, c.count) for c in result.plan.cells] == [(4, 2), (1, 1)]
    assert [(c.gpus, c.count) for c in result.change.keep] == [(4, 1), (1, 1)]
    assert [(c.gpus, c.count) for c in result.change.add] == [(4, 1)]
    assert [(c.gpus, c.count) for c in result.change.remove] == [(1, 2)]
    # A cell of the same size but different replicas is not identical: it is replaced.
    changed = current.model_copy(deep=True)
    changed.cells[0].replicas = {"EL": 4}
    swap = plan_changes(changed, result.plan)
    assert [(c.gpus, c.count, c.replicas) for c in swap.remove] == [(4, 1, {"EL": 4}), (1, 2, {"EL": 1})]
    assert [(c.gpus, c.count) for c in swap.add] == [(4, 2)]
    # Kept + added is the new plan; kept + removed is the old one.
    for plan, parts in (
        (result.plan, result.change.keep + result.change.add),
        (current, result.change.keep + result.change.remove),
    ):
        assert sum(c.gpus * c.count for c in parts) == plan.gpus


# E on 1 GPU (2 req/s) and L on 4 GPUs (6 req/s): a complete instance needs 5 GPUs, so the
# smallest (and largest) kept cell is 8 GPUs, and budgets of 5–7 GPUs fit no power-of-two cell.
FIVE_GPU_SPLIT = {
    "components": ["E", "L"],
    "options": [
        {"name": "E", "components": ["E"], "gpus": 1, "throughput": 2.0},
        {"name": "L", "components": ["L"], "gpus": 4, "throughput": 6.0},
    ],
    "request_types": [{"name": "image", "components": ["E", "L"], "share": 1.0}],
}


def best_rate(model, budget: int) -> float:
    """The most req/s of any replica vector within `budget` GPUs (exhaustive, path formulation)."""
    return max(rate for _, rate in exhaustive(model, budget))


def test_budgets_no_power_of_two_cell_fits_plan_a_cell_of_exactly_those_gpus():
    spec = parse_spec(FIVE_GPU_SPLIT)
    model = build_model(spec)
    assert [c.gpus for c in plan_cells(model, 4)] == [8]
    rates = []
    for budget in (5, 6, 7):
        plan = plan_for_budget(spec, budget, 4)
        assert plan.gpus == budget and [(c.gpus, c.count) for c in plan.cells] == [(budget, 1)]
        assert plan.throughput == pytest.approx(best_rate(model, budget))
        rates.append(plan.throughput)
    assert rates == sorted(rates) and rates[0] > 0 and rates[-1] > rates[0]
    eight = plan_for_budget(spec, 8, 4).throughput
    for budget in (13, 14, 15):  # one 8-GPU cell and a cell on the 5, 6 or 7 left over
        plan = plan_for_budget(spec, budget, 4)
        assert [(c.gpus, c.count) for c in plan.cells] == [(8, 1), (budget - 8, 1)]
        assert plan.gpus == budget
        assert plan.throughput == pytest.approx(eight + best_rate(model, budget - 8))
        assert plan.routing["image"] == pytest.approx({"E->L": 1.0})


def test_a_budget_holding_no_instance_names_the_fewest_gpus_one_needs():
    spec = parse_spec(FIVE_GPU_SPLIT)
    fewest = min(gpus for gpus, rate in exhaustive(build_model(spec), 8) if rate > 0)
    assert fewest == 5
    for budget in (1, 3, 4):
        with pytest.raises(InfeasibleError, match=f"needs at least {fewest} GPUs; give at least {fewest}$"):
            plan_for_budget(spec, budget, 4)


def test_budgets_below_the_largest_cell_get_the_best_deployment_of_that_size():
    """Below the largest kept cell a plan is as good as one MILP on the whole budget (random specs)."""
    rng = random.Random(21)
    for _ in range(12):
        spec = random_spec(rng)
        model = build_model(spec)
        cells = plan_cells(model, 3)
        for budget in range(1, cells[-1].gpus):
            best = max_throughput(model, budget).throughput
            if best <= 0:
                with pytest.raises(InfeasibleError, match="holds no complete instance"):
                    budget_mixture(model, cells, budget)
                continue
            with_leftover, mix = budget_mixture(model, cells, budget)
            assert gpus_of(mix) <= budget
            assert mixture_throughput(with_leftover, mix) == pytest.approx(best, rel=1e-6)


def test_budgets_that_are_powers_of_two_plan_exactly_as_the_binary_decomposition():
    rng = random.Random(4)
    specs = [parse_spec(FIVE_GPU_SPLIT)] + [random_spec(rng) for _ in range(8)]
    for spec in specs:
        model = build_model(spec)
        cells = plan_cells(model, 3)
        for budget in (2**k for k in range(6)):
            if budget < cells[0].gpus:
                continue
            before = make_plan(model, cells, mixture_for_budget(cells, budget), 8)
            assert plan_for_budget(spec, budget, 3).model_dump() == before.model_dump()


def test_leftover_cells_round_trip_and_replan_like_any_cell(tmp_path):
    spec = parse_spec(FIVE_GPU_SPLIT)
    plan = plan_for_budget(spec, 13, 4)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_json_dict()))
    running = load_plan(path)
    same = plan_changes(running, plan_for_budget(spec, 13, 4))
    assert [(c.gpus, c.count) for c in same.keep] == [(8, 1), (5, 1)] and not same.add and not same.remove
    grow = plan_changes(running, plan_for_budget(spec, 16, 4))
    assert [(c.gpus, c.count) for c in grow.keep] == [(8, 1)]
    assert [(c.gpus, c.count) for c in grow.add] == [(8, 1)]
    assert [(c.gpus, c.count) for c in grow.remove] == [(5, 1)]


def test_targets_needing_more_than_a_million_gpus_are_refused_before_any_mixture():
    spec = parse_spec(single(1, 5.0))  # one 1-GPU replica: 5 req/s per GPU, whatever the cell
    largest = plan_cells(build_model(spec), 6)[-1]
    per_gpu = largest.throughput / largest.gpus
    at_limit = plan_for_target(spec, per_gpu * MAX_PLAN_GPUS)
    assert at_limit.gpus == MAX_PLAN_GPUS
    over = per_gpu * MAX_PLAN_GPUS * 1.001
    needed = math.ceil(over / per_gpu - 1e-6)
    message = f"needs at least {needed:,} GPUs \\(one {largest.gpus}-GPU cell gives {largest.throughput:.4g} req/s\\)"
    with pytest.raises(InfeasibleError, match=message) as info:
        plan_for_target(spec, over)
    assert "\n" not in str(info.value)
    start = time.perf_counter()
    with pytest.raises(InfeasibleError, match="more than the planner's limit of 1,000,000"):
        plan_for_target(spec, 1e300)
    assert time.perf_counter() - start < 5
