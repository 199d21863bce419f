"""Cells (000 §4.3): Algorithm 1, mixtures for a target and for a budget, re-planning."""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter

import pytest
from planner_instances import cells_from, random_cells

from prismserve.planner import (
    InfeasibleError,
    build_model,
    greedy_mixture,
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
        "executors": [{"name": "L", "components": ["L"], "gpus": component_gpus, "throughput": throughput}],
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
            "executors": [
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
            "executors": [
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
