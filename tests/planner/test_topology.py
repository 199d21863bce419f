"""The topology-aware MILP (000 Appendix A): node GPUs and link bandwidth bind."""

from __future__ import annotations

import random

import pytest
from planner_instances import random_spec_data

from prismserve.planner import (
    InfeasibleError,
    SpecError,
    build_model,
    max_throughput,
    max_throughput_on_topology,
    min_gpus,
    min_gpus_on_topology,
    parse_spec,
    plan_on_topology,
)

BASE = {
    "components": ["E", "L"],
    "options": [
        {"name": "E", "components": ["E"], "gpus": 1, "throughput": 10.0},
        {"name": "L", "components": ["L"], "gpus": 1, "throughput": 10.0},
    ],
    "request_types": [{"name": "image", "components": ["E", "L"], "share": 1.0}],
}


def on(nodes, bandwidth, links=(), data=BASE):
    topology = {
        "nodes": [{"name": n, "gpus": g} for n, g in nodes],
        "bandwidth": bandwidth,
        "edge_bytes": {"E->L": 1e6},
    }
    if links:
        topology["links"] = [{"nodes": list(pair), "bandwidth": b} for pair, b in links]
    return build_model(parse_spec({**data, "topology": topology}))


def test_replicas_stay_within_each_nodes_gpus():
    solution = max_throughput_on_topology(on([("a", 3), ("b", 3)], 1e12))
    assert solution.throughput == pytest.approx(30.0)
    assert solution.gpus == 6
    assert all(sum(replicas.values()) <= 3 for replicas in solution.placement.values())


def test_an_option_larger_than_every_node_cannot_be_placed():
    data = {
        **BASE,
        "options": [
            BASE["options"][0],
            {"name": "L", "components": ["L"], "gpus": 4, "throughput": 10.0},
        ],
    }
    # Without topology 6 GPUs hold E + L (4 GPUs); on two 3-GPU nodes L fits nowhere.
    assert max_throughput(build_model(parse_spec(data)), 6).throughput == pytest.approx(10.0)
    with pytest.raises(
        InfeasibleError, match="no placement on the topology's nodes serves every request type"
    ):
        max_throughput_on_topology(on([("a", 3), ("b", 3)], 1e12, data=data))


def test_bandwidth_between_nodes_binds():
    nodes = [("a", 3), ("b", 1)]
    # Plenty of bandwidth: 2 E + 2 L, E's embeddings cross the link for 10 req/s.
    assert max_throughput_on_topology(on(nodes, 1e12)).throughput == pytest.approx(20.0)
    # 2 MB/s carries 2 req/s of 1 MB embeddings: 10 req/s stay on node a, 2 more cross.
    thin = max_throughput_on_topology(on(nodes, 2e6))
    assert thin.throughput == pytest.approx(12.0)
    # A link override of 0 B/s leaves node b useless for this model.
    assert max_throughput_on_topology(on(nodes, 1e12, links=[(("a", "b"), 0.0)])).throughput == pytest.approx(
        10.0
    )
    routing = plan_on_topology(on(nodes, 2e6).spec).routing
    assert routing == {"image": {"E->L": pytest.approx(1.0)}}


def test_fewest_gpus_on_the_topology_for_a_target():
    nodes = [("a", 3), ("b", 1)]
    solution = min_gpus_on_topology(on(nodes, 2e6), 12.0)
    assert solution.gpus == 4 and solution.throughput == pytest.approx(12.0)
    with pytest.raises(InfeasibleError, match="cannot sustain 12.5 req/s"):
        min_gpus_on_topology(on(nodes, 2e6), 12.5)
    plan = plan_on_topology(on(nodes, 2e6).spec, rps=12.0)
    assert plan.gpus == 4 and {c.node for c in plan.cells} == {"a", "b"}
    assert sum(c.throughput for c in plan.cells) == pytest.approx(12.0)  # rate entering at each node


def test_a_budget_caps_the_topology_plan():
    assert max_throughput_on_topology(on([("a", 3), ("b", 3)], 1e12), budget=4).throughput == pytest.approx(
        20.0
    )


def test_one_big_node_matches_the_plain_milp_on_random_instances():
    rng = random.Random(21)
    for _ in range(25):
        data = random_spec_data(rng)
        budget = rng.randint(2, 6)
        data["topology"] = {"nodes": [{"name": "only", "gpus": budget}], "bandwidth": 0.0}
        model = build_model(parse_spec(data))
        plain = max_throughput(model, budget)
        if plain.throughput <= 0:
            with pytest.raises(InfeasibleError):
                max_throughput_on_topology(model)
            continue
        placed = max_throughput_on_topology(model)
        assert placed.throughput == pytest.approx(plain.throughput, rel=1e-6)
        assert placed.gpus == plain.gpus
        target = plain.throughput * rng.uniform(0.3, 1.0)
        assert min_gpus_on_topology(model, target).gpus == min_gpus(model, target).gpus


def test_topology_planning_needs_a_topology_section():
    with pytest.raises(SpecError, match="needs a `topology` section"):
        max_throughput_on_topology(build_model(parse_spec(BASE)))
