"""The MILPs (000 Appendix B) against exhaustive search over integer replica vectors."""

from __future__ import annotations

import random

import pytest
from planner_instances import exhaustive, random_spec

from prismserve.planner import InfeasibleError, SpecError, build_model, max_throughput, min_gpus, parse_spec


def check_against_exhaustive(model, budget: int, rng: random.Random) -> None:
    table = exhaustive(model, budget)
    best = max(rate for _, rate in table)
    solved = max_throughput(model, budget)
    assert solved.throughput == pytest.approx(best, rel=1e-6, abs=1e-9)
    if best <= 0:
        assert solved.replicas == {}
        return
    # The plan carries no idle replicas: the fewest GPUs that reach the optimum.
    assert solved.gpus == min(cost for cost, rate in table if rate >= best * (1 - 1e-7))
    assert solved.gpus <= budget
    target = best * rng.uniform(0.2, 1.0)
    cheapest = min(cost for cost, rate in table if rate >= target * (1 - 1e-9))
    assert min_gpus(model, target).gpus == cheapest


@pytest.mark.parametrize("seed", range(4))
def test_both_variants_equal_exhaustive_search_on_random_instances(seed):
    """200 instances (50 per seed) with enumerated paths: max throughput and min GPUs are optimal."""
    rng = random.Random(seed)
    for _ in range(50):
        check_against_exhaustive(build_model(random_spec(rng)), rng.randint(1, 6), rng)


def test_both_variants_equal_exhaustive_search_with_explicit_paths():
    """60 more instances whose types list a subset of their valid paths."""
    rng = random.Random(100)
    for _ in range(60):
        check_against_exhaustive(build_model(random_spec(rng, explicit_paths=True)), rng.randint(1, 6), rng)


def test_a_budget_too_small_for_any_instance_gives_zero_throughput():
    spec = parse_spec(
        {
            "components": ["L"],
            "options": [{"name": "L", "components": ["L"], "gpus": 4, "throughput": 3.0}],
            "request_types": [{"name": "text", "components": ["L"], "share": 1.0}],
        }
    )
    model = build_model(spec)
    assert max_throughput(model, 3).throughput == 0.0
    solved = max_throughput(model, 8)
    assert solved.throughput == pytest.approx(6.0) and solved.replicas == {"L": 2} and solved.gpus == 8


def test_min_gpus_rejects_a_non_positive_target():
    model = build_model(
        parse_spec(
            {
                "components": ["L"],
                "options": [{"name": "L", "components": ["L"], "gpus": 1, "throughput": 3.0}],
                "request_types": [{"name": "text", "components": ["L"], "share": 1.0}],
            }
        )
    )
    with pytest.raises(SpecError, match="target throughput must be a finite number > 0"):
        min_gpus(model, 0.0)
    with pytest.raises(SpecError, match="target throughput must be a finite number > 0"):
        min_gpus(model, float("inf"))
    assert issubclass(InfeasibleError, ValueError) and issubclass(SpecError, ValueError)


def test_capacity_divides_rates_by_throughput_equation_9_is_a_typo():
    """Σ x/w ≤ r (eqs. 11, 14): 3 replicas of a 4 req/s option carry 12 req/s, not 3/4 (x·w ≤ r)."""
    model = build_model(
        parse_spec(
            {
                "components": ["L"],
                "options": [{"name": "L", "components": ["L"], "gpus": 1, "throughput": 4.0}],
                "request_types": [{"name": "text", "components": ["L"], "share": 1.0}],
            }
        )
    )
    assert max_throughput(model, 3).throughput == pytest.approx(12.0)
    assert min_gpus(model, 12.0).replicas == {"L": 3}
    assert min_gpus(model, 12.1).replicas == {"L": 4}
