"""Replicas sharing one machine's CPUs (declared GPUs on a CPU-only machine): the planned rate is capped
where the CPUs are all busy, and the plan does not hold replicas that would idle."""

from __future__ import annotations

import pytest

from prismserve.planner import (
    InfeasibleError,
    SpecError,
    load_spec,
    parse_spec,
    plan_for_budget,
    plan_for_target,
)

EXAMPLE = "docs/examples/mllm_small.yaml"


def with_host(cpus: float, text: float, image: float):
    data = load_spec(EXAMPLE).model_dump()
    data["host"] = {"cpus": cpus, "seconds": {"text": text, "image+text": image}}
    return parse_spec(data)


def test_the_host_caps_the_budget_plan_at_its_cpus_and_uses_no_more_gpus_than_reach_it():
    free = plan_for_budget(load_spec(EXAMPLE), 8)
    spec = with_host(2, 0.1, 0.2)  # 0.3 * 0.1 + 0.7 * 0.2 = 0.17 CPU-s per request: 11.76 req/s on 2 CPUs
    cap = 2 / 0.17
    assert spec.host_capacity() == pytest.approx(cap)
    assert free.throughput > cap  # without the host, 8 GPUs plan beyond what 2 CPUs can serve
    capped = plan_for_budget(spec, 8)
    assert capped.throughput == pytest.approx(cap)
    assert capped.total_gpus < 8
    assert capped.total_gpus == plan_for_target(load_spec(EXAMPLE), cap).total_gpus


def test_a_host_that_is_not_the_bottleneck_changes_nothing():
    assert plan_for_budget(with_host(64, 0.01, 0.01), 8) == plan_for_budget(load_spec(EXAMPLE), 8)


def test_a_target_beyond_the_hosts_cpus_is_refused_in_one_line():
    with pytest.raises(
        InfeasibleError, match=r"beyond what the replicas' shared 2 CPUs sustain \(11.8 req/s"
    ):
        plan_for_target(with_host(2, 0.1, 0.2), 20.0)


def test_host_times_must_cover_every_request_type():
    data = load_spec(EXAMPLE).model_dump()
    data["host"] = {"cpus": 2, "seconds": {"text": 0.1}}
    with pytest.raises(
        SpecError, match=r"host.seconds must give every request type's CPU-seconds: missing \['image\+text'\]"
    ):
        parse_spec(data)
