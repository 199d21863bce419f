"""Request-static routing (000 §5.3, Figure 5): path probabilities from planned rates."""

from __future__ import annotations

import random

import pytest
from planner_instances import random_spec

from prismserve.planner import (
    build_model,
    parse_spec,
    path_probabilities,
    plan_cells,
    plan_for_budget,
    split_paths,
)
from prismserve.planner.cells import budget_mixture

FIGURE_4 = {
    "components": ["E", "L"],
    "options": [
        {"name": "E", "components": ["E"], "gpus": 1, "throughput": 10.0},
        {"name": "L", "components": ["L"], "gpus": 1, "throughput": 10.0},
        {"name": "EL", "components": ["E", "L"], "gpus": 1, "throughput": 5.0},
    ],
    "request_types": [{"name": "image+text", "components": ["E", "L"], "share": 1.0}],
}


def test_per_hop_splits_multiply_along_a_path_figure_5():
    # 7:3 between the encoder and the monolith, then 5:2 after the encoder between EL and L.
    hops = [
        ("start", "encoded", "E", 7.0),
        ("start", "end", "EL", 3.0),
        ("encoded", "end", "EL", 5.0),
        ("encoded", "end", "L", 2.0),
    ]
    rates = split_paths(hops, "start", "end", total=10.0)
    assert rates == pytest.approx({"E->EL": 5.0, "E->L": 2.0, "EL": 3.0})
    model = build_model(parse_spec(FIGURE_4))
    routing = path_probabilities(model, [(1.0, {("image+text", name): rate for name, rate in rates.items()})])
    assert routing == {"image+text": pytest.approx({"E->EL": 0.5, "E->L": 0.2, "EL": 0.3})}


def test_probabilities_are_over_the_whole_mixture_weighted_by_cell_counts():
    model = build_model(parse_spec(FIGURE_4))
    big = {("image+text", "E->L"): 8.0}  # a cell of 8 req/s, all on E->L
    small = {("image+text", "EL"): 1.0}  # a cell of 1 req/s on the monolith
    routing = path_probabilities(model, [(3.0, big), (2.0, small)])["image+text"]
    # 3 big cells take 24 req/s, 2 small ones 2: each cell gets exactly its planned rate.
    assert routing == pytest.approx({"E->L": 24 / 26, "EL": 2 / 26})


def path_loads(model, request_type, rates: dict[str, float]) -> dict[str, float]:
    """Seconds of work per second on every option from path rates of one type."""
    loads: dict[str, float] = {}
    paths = {p.name: p for p in model.paths[request_type]}
    for name, rate in rates.items():
        path = paths[name]
        for option, role in zip(path.options, path.roles, strict=True):
            loads[option] = loads.get(option, 0.0) + rate * model.seconds(option, role)
    return loads


def test_plan_probabilities_sum_to_one_and_reproduce_the_planned_rates():
    rng = random.Random(8)
    for _ in range(25):
        spec = random_spec(rng)
        model = build_model(spec)
        budget = rng.randint(4, 20)
        # The binary decomposition, with a cell on the leftover GPUs where that does better.
        cells, mix = budget_mixture(model, plan_cells(model, 3), budget)
        plan = plan_for_budget(spec, budget, max_exponent=3)
        by_size = {c.gpus: c for c in cells}
        for cell in cells:
            # Inside a cell: path rates add up to each type's share of the cell's rate, and the load
            # they put on every option fits the cell's replicas.
            load: dict[str, float] = {}
            for t in spec.request_types:
                mine = {name: r for (tt, name), r in cell.solution.rates.items() if tt == t.name}
                assert sum(mine.values()) == pytest.approx(t.share * cell.throughput, rel=1e-6)
                for option, seconds in path_loads(model, t.name, mine).items():
                    load[option] = load.get(option, 0.0) + seconds
            for option, seconds in load.items():
                assert seconds <= cell.solution.replicas.get(option, 0) + 1e-6
        for t in spec.request_types:
            probabilities = plan.routing[t.name]
            assert sum(probabilities.values()) == pytest.approx(1.0)
            # P(p | t) times the type's planned rate is the sum of that path's planned rates over cells.
            rate = t.share * plan.throughput
            for name, probability in probabilities.items():
                planned = sum(
                    count * by_size[size].solution.rates.get((t.name, name), 0.0)
                    for size, count in mix.items()
                )
                assert probability * rate == pytest.approx(planned, rel=1e-6, abs=1e-9)
