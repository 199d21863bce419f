"""A running plan's capacity at another mix, and the spec at another mix, against hand-computed values
and the path-formulation LP with fixed replicas."""

from __future__ import annotations

import random

import pytest
from planner_instances import FixedReplicasLP, random_spec
from toy.specs import ENCODER_LLM

from prismserve.planner import (
    Plan,
    SpecError,
    build_model,
    fixed_replicas_throughput,
    max_throughput,
    parse_spec,
    plan_capacity,
    plan_for_budget,
    spec_at_mix,
)


def test_the_capacity_of_fixed_replicas_at_two_mixes_is_the_hand_computed_bottleneck():
    spec = parse_spec(ENCODER_LLM)
    plan = Plan.model_validate({"cells": [{"gpus": 4, "replicas": {"E": 1, "L": 3}}]})
    # At 10 % images: L is the bottleneck, 3 replicas / 0.25 s = 12 req/s (E alone would allow 20).
    assert plan_capacity(spec, plan) == pytest.approx(12.0)
    # At 90 % images: E is, 1 / (0.9 x 0.5 s) = 2.22 req/s.
    images = spec_at_mix(spec, {"text": 0.1, "image+text": 0.9})
    assert plan_capacity(images, plan) == pytest.approx(1 / 0.45)
    # Two cells of one E and one L: pooled, 2 / 0.45 = 4.44 req/s, which is also the planner's plan.
    assert plan_for_budget(images, 4).replicas() == {"E": 2, "L": 2}
    assert plan_capacity(images, plan_for_budget(images, 4)) == pytest.approx(2 / 0.45)


def test_the_spec_at_another_mix_keeps_every_per_request_time():
    spec = parse_spec(ENCODER_LLM)
    images = spec_at_mix(spec, {"text": 1, "image+text": 9})  # weights are normalised
    assert {t.name: t.share for t in images.request_types} == pytest.approx({"text": 0.1, "image+text": 0.9})
    # E's throughput over the mix falls as more requests need it: 1 / (0.9 x 0.5 s).
    assert {e.name: e.throughput for e in images.options} == pytest.approx({"E": 1 / 0.45, "L": 4.0})
    rng = random.Random(7)
    for _ in range(40):
        spec = random_spec(rng)
        before = build_model(spec)
        after = build_model(spec_at_mix(spec, {t.name: rng.uniform(0.05, 1) for t in spec.request_types}))
        for name, graph in before.graphs.items():
            for hop in graph.hops:
                assert after.seconds(hop.option, hop.role, name) == pytest.approx(
                    before.seconds(hop.option, hop.role, name), rel=1e-9
                )


def test_fixed_replicas_throughput_equals_the_path_formulation_lp_on_random_instances():
    rng = random.Random(11)
    for _ in range(60):
        model = build_model(random_spec(rng, explicit_paths=rng.random() < 0.3))
        reference = FixedReplicasLP(model)
        replicas = tuple(rng.randint(0, 3) for _ in reference.options)
        solved = fixed_replicas_throughput(model, dict(zip(reference.options, replicas, strict=True)))
        assert solved.throughput == pytest.approx(reference.max_rate(replicas), rel=1e-6, abs=1e-9)


def test_the_planners_own_replicas_sustain_its_throughput():
    rng = random.Random(12)
    for _ in range(20):
        model = build_model(random_spec(rng))
        best = max_throughput(model, rng.randint(1, 6))
        assert fixed_replicas_throughput(model, best.replicas).throughput == pytest.approx(
            best.throughput, rel=1e-6, abs=1e-9
        )


def test_shares_and_replicas_naming_what_the_spec_lacks_are_refused():
    spec = parse_spec(ENCODER_LLM)
    with pytest.raises(SpecError, match=r"request types \['video'\] the spec does not have"):
        spec_at_mix(spec, {"text": 0.5, "image+text": 0.4, "video": 0.1})
    with pytest.raises(SpecError, match=r"needs a share > 0 .*\['image\+text'\]"):
        spec_at_mix(spec, {"text": 1.0})
    with pytest.raises(SpecError, match=r"replicas name options \['EL'\]"):
        fixed_replicas_throughput(build_model(spec), {"EL": 1})
