"""The planner: paths, Algorithm 3, the MILPs against exhaustive search, cells, mixtures, routing."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter

import highspy
import numpy as np
import pytest

from prismserve.cli import main
from prismserve.planner import (
    Cell,
    InfeasibleError,
    SpecError,
    Solution,
    build_model,
    greedy_mixture,
    max_throughput,
    max_throughput_on_topology,
    min_gpus,
    mixture_for_budget,
    mixture_for_target,
    mixture_throughput,
    parse_spec,
    path_probabilities,
    plan_cells,
    plan_for_budget,
    plan_for_target,
    replan,
    valid_paths,
)

# --- paths ---------------------------------------------------------------------------------------


def spec_elg(executors):
    return parse_spec(
        {
            "components": ["E", "L", "G"],
            "executors": [{"name": n, "components": list(n), "gpus": 1, "throughput": 1.0} for n in executors],
            "request_types": [
                {"name": "text", "components": ["L"], "share": 0.5},
                {"name": "all", "components": ["E", "L", "G"], "share": 0.5},
            ],
        }
    )


def test_paths_may_pass_through_colocated_executors_in_model_order():
    spec = spec_elg(["E", "L", "G", "EL", "LG", "ELG", "EG"])
    names = {t.name: sorted(p.name for p in valid_paths(spec, t)) for t in spec.request_types}
    # A text-only request runs on the colocated executors too, with role {L}.
    assert names["text"] == ["EL", "ELG", "L", "LG"]
    assert {"E->L->G", "E->LG", "EL->G", "EL->LG", "ELG"} <= set(names["all"])
    # EG may serve only G, once L has run elsewhere; first on a path its role {E, G} would skip L.
    assert "E->L->EG" in names["all"]
    for path in names["all"]:
        hops = path.split("->")
        if "EG" in hops:
            assert any("L" in hop for hop in hops[: hops.index("EG")]), path


def test_explicit_paths_are_checked():
    data = spec_elg(["E", "L", "G", "EG"]).model_dump()
    data["request_types"][1]["paths"] = [["EG", "L"]]
    with pytest.raises(SpecError, match=r"path EG->L does not run each of \['E', 'L', 'G'\] exactly once in model order"):
        build_model(parse_spec(data))


# --- Algorithm 3 -----------------------------------------------------------------------------------


def test_algorithm_3_times_add_and_the_colocation_factor_matches_the_measured_mean():
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
    model = build_model(spec)
    assert model.tau["E"] == pytest.approx((1 / 20) / 0.7) and model.tau["L"] == pytest.approx(1 / 6)
    # The mix's mean time on EL equals its measured 1/4 s.
    mean = 0.3 * model.alpha["EL"] * model.tau["L"] + 0.7 * model.alpha["EL"] * (model.tau["E"] + model.tau["L"])
    assert mean == pytest.approx(1 / 4)
    paths = [p.name for p in model.paths["image"]]
    el = paths.index("EL")
    assert model.throughput("EL", "image", el) == pytest.approx(1 / (model.alpha["EL"] * (model.tau["E"] + model.tau["L"])))
    assert model.throughput("E", "image", el) == float("inf")


def test_a_component_only_inside_colocated_executors_is_rejected_by_name():
    with pytest.raises(SpecError, match="component 'E' has no executor that runs it alone"):
        parse_spec(
            {
                "components": ["E", "L"],
                "executors": [
                    {"name": "L", "components": ["L"], "gpus": 1, "throughput": 6.0},
                    {"name": "EL", "components": ["E", "L"], "gpus": 1, "throughput": 4.0},
                ],
                "request_types": [{"name": "image", "components": ["E", "L"], "share": 1.0}],
            }
        )


# --- the MILP against exhaustive search ------------------------------------------------------------


def random_spec(rng: random.Random):
    components = ["A", "B", "C"][: rng.randint(2, 3)]
    executors = [{"name": c, "components": [c], "gpus": rng.choice([1, 1, 2]), "throughput": round(rng.uniform(0.5, 8), 2)} for c in components]
    for size in range(2, len(components) + 1):
        for combo in itertools.combinations(components, size):
            if rng.random() < 0.35 and len(executors) < 5:
                executors.append({"name": "".join(combo), "components": list(combo), "gpus": rng.choice([1, 2]), "throughput": round(rng.uniform(0.3, 5), 2)})
    types = []
    for i in range(rng.randint(1, 3)):
        k = rng.randint(1, len(components))
        types.append({"name": f"t{i}", "components": sorted(rng.sample(components, k), key=components.index)})
    shares = [rng.uniform(0.1, 1) for _ in types]
    for t, s in zip(types, shares):
        t["share"] = s / sum(shares)
    types[-1]["share"] = 1 - sum(t["share"] for t in types[:-1])
    return parse_spec({"components": components, "executors": executors, "request_types": types})


class FixedReplicasLP:
    """max R with replicas fixed: one HiGHS LP per instance, re-solved with new capacity bounds."""

    def __init__(self, model):
        self.model = model
        self.executors = [e.name for e in model.spec.executors]
        self.pairs = [(t, p) for t, paths in model.paths.items() for p in range(len(paths))]
        h = self.h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        n = len(self.pairs) + 1
        h.addVars(n, np.zeros(n), np.full(n, highspy.kHighsInf))
        for s in self.executors:
            cols = [j for j, (t, p) in enumerate(self.pairs) if model.work.get((s, t, p))]
            vals = [model.work[(s, *self.pairs[j])] for j in cols]
            h.addRow(-highspy.kHighsInf, 0.0, len(cols), np.array(cols, dtype=np.int32), np.array(vals))
        for request_type in model.spec.request_types:
            cols = [j for j, (t, _) in enumerate(self.pairs) if t == request_type.name] + [n - 1]
            vals = [1.0] * (len(cols) - 1) + [-request_type.share]
            h.addRow(0.0, 0.0, len(cols), np.array(cols, dtype=np.int32), np.array(vals))
        h.changeColsCost(1, np.array([n - 1], dtype=np.int32), np.array([1.0]))
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)

    def max_rate(self, replicas: tuple[int, ...]) -> float:
        for i, r in enumerate(replicas):
            self.h.changeRowBounds(i, -highspy.kHighsInf, float(r))
        self.h.run()
        return self.h.getInfo().objective_function_value


def exhaustive(model, budget: int) -> list[tuple[int, float]]:
    """(GPUs, max rate) of every replica vector within the budget."""
    lp = FixedReplicasLP(model)
    gpus = [model.spec.executor(s).gpus for s in lp.executors]
    out = []
    for replicas in itertools.product(*(range(budget // g + 1) for g in gpus)):
        cost = sum(g * r for g, r in zip(gpus, replicas))
        if cost <= budget:
            out.append((cost, lp.max_rate(replicas)))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_milp_equals_exhaustive_search_on_random_instances(seed):
    """200 random instances in all (50 per seed): both MILP variants match exhaustive search."""
    rng = random.Random(seed)
    for _ in range(50):
        spec = random_spec(rng)
        model = build_model(spec)
        budget = rng.randint(1, 5)
        table = exhaustive(model, budget)
        best = max(rate for _, rate in table)
        solved = max_throughput(model, budget)
        assert solved.throughput == pytest.approx(best, rel=1e-6, abs=1e-9)
        if best > 0:
            assert solved.gpus == min(cost for cost, rate in table if rate >= best * (1 - 1e-7))
            target = best * rng.uniform(0.3, 1.0)
            cheapest = min(cost for cost, rate in table if rate >= target * (1 - 1e-9))
            assert min_gpus(model, target).gpus == cheapest


# --- cells and mixtures ----------------------------------------------------------------------------


def cells_from(pairs):
    return [Cell(g, Solution(r, {}, {}, g)) for g, r in pairs]


def test_the_greedy_counterexample_from_the_notes():
    cells = cells_from([(1, 1.0), (2, 2.5), (4, 6.0)])
    assert mixture_for_target(cells, 5.5) == Counter({4: 1})
    greedy = greedy_mixture(cells, 5.5)
    assert sum(g * n for g, n in greedy.items()) == 5  # 2 + 2 + 1: the paper's Algorithm 2


def random_cells(rng):
    """Efficient power-of-two cells: per-GPU throughput strictly grows with size."""
    cells, per_gpu = [], rng.uniform(0.5, 2)
    for exponent in range(rng.randint(0, 2), rng.randint(3, 5)):
        if cells and rng.random() < 0.3:
            continue  # a dropped size
        per_gpu *= rng.uniform(1.01, 1.5)
        cells.append((2**exponent, round(per_gpu * 2**exponent, 3)))
    return cells_from(cells)


def test_mixture_for_target_is_never_worse_than_exhaustive_search_and_greedy():
    rng = random.Random(11)
    for _ in range(300):
        cells = random_cells(rng)
        target = rng.uniform(0.1, 80)
        mix = mixture_for_target(cells, target)
        assert mixture_throughput(cells, mix) >= target - 1e-9
        gpus = sum(g * n for g, n in mix.items())
        bound = [int(target / c.throughput) + 2 for c in cells]
        best = min(
            sum(c.gpus * n for c, n in zip(cells, counts))
            for counts in itertools.product(*(range(b + 1) for b in bound))
            if sum(c.throughput * n for c, n in zip(cells, counts)) >= target - 1e-9
        )
        assert gpus == best
        assert gpus <= sum(g * n for g, n in greedy_mixture(cells, target).items())


def test_binary_decomposition_matches_an_exhaustive_knapsack():
    rng = random.Random(5)
    for _ in range(300):
        cells = random_cells(rng)
        budget = rng.randint(cells[0].gpus, 70)
        mix = mixture_for_budget(cells, budget)
        assert sum(g * n for g, n in mix.items()) <= budget
        best = [0.0] * (budget + 1)
        for capacity in range(1, budget + 1):
            best[capacity] = max([best[capacity - 1]] + [best[capacity - c.gpus] + c.throughput for c in cells if c.gpus <= capacity])
        assert mixture_throughput(cells, mix) == pytest.approx(best[budget])


def test_budget_below_the_smallest_cell_is_infeasible():
    with pytest.raises(InfeasibleError, match="budget of 1 GPUs is below the smallest cell \\(2 GPUs\\)"):
        mixture_for_budget(cells_from([(2, 3.0)]), 1)


def test_algorithm_1_drops_sizes_without_an_instance_and_inefficient_sizes():
    spec = parse_spec(
        {
            "components": ["L"],
            "executors": [{"name": "L2", "components": ["L"], "gpus": 2, "throughput": 5.0}],
            "request_types": [{"name": "text", "components": ["L"], "share": 1.0}],
        }
    )
    cells = plan_cells(build_model(spec), 3)
    # 1 GPU holds no replica; 4 and 8 GPUs only repeat the 2-GPU cell.
    assert [(c.gpus, c.throughput) for c in cells] == [(2, 5.0)]


def test_replanning_keeps_identical_cells():
    kept, added, removed = replan(Counter({4: 3, 1: 2}), Counter({4: 4, 2: 1}))
    assert kept == Counter({4: 3}) and added == Counter({4: 1, 2: 1}) and removed == Counter({1: 2})


# --- routing -------------------------------------------------------------------------------------------


def test_path_probabilities_multiply_per_hop_splits_figure_5():
    spec = parse_spec(
        {
            "components": ["E", "L"],
            "executors": [
                {"name": "E", "components": ["E"], "gpus": 1, "throughput": 10.0},
                {"name": "L", "components": ["L"], "gpus": 1, "throughput": 10.0},
                {"name": "EL", "components": ["E", "L"], "gpus": 1, "throughput": 5.0},
            ],
            "request_types": [{"name": "image", "components": ["E", "L"], "share": 1.0}],
        }
    )
    model = build_model(spec)
    index = {p.name: i for i, p in enumerate(model.paths["image"])}
    # 7:3 between the encoder and the monolith, then 5:2 after the encoder between EL and L.
    rates = {("image", index["E->EL"]): 5.0, ("image", index["E->L"]): 2.0, ("image", index["EL"]): 3.0}
    routing = path_probabilities(model, [(1.0, rates)])["image"]
    assert routing == pytest.approx({"E->EL": 0.5, "E->L": 0.2, "EL": 0.3})


def test_plan_probabilities_sum_to_one_and_reproduce_the_planned_rates():
    rng = random.Random(8)
    for _ in range(20):
        spec = random_spec(rng)
        model = build_model(spec)
        plan = plan_for_budget(spec, rng.randint(4, 20), max_exponent=3)
        cells = plan_cells(model, 3)
        by_size = {c.gpus: c for c in cells}
        for request_type, paths in plan.routing.items():
            assert sum(paths.values()) == pytest.approx(1.0)
            names = [p.name for p in model.paths[request_type]]
            total = sum(cp.count * sum(by_size[cp.gpus].solution.rates.get((request_type, i), 0) for i in range(len(names))) for cp in plan.cells)
            for path, probability in paths.items():
                planned = sum(cp.count * by_size[cp.gpus].solution.rates.get((request_type, names.index(path)), 0) for cp in plan.cells)
                assert probability * total == pytest.approx(planned)


# --- topology-aware --------------------------------------------------------------------------------


def test_topology_keeps_replicas_within_node_gpus_and_bandwidth_binds():
    base = {
        "components": ["E", "L"],
        "executors": [
            {"name": "E", "components": ["E"], "gpus": 1, "throughput": 10.0},
            {"name": "L", "components": ["L"], "gpus": 1, "throughput": 10.0},
        ],
        "request_types": [{"name": "image", "components": ["E", "L"], "share": 1.0}],
    }
    # Two nodes of 3 GPUs: the best split puts E and L on both nodes.
    fat = parse_spec({**base, "topology": {"nodes": [{"name": "a", "gpus": 3}, {"name": "b", "gpus": 3}], "bandwidth": 1e12, "edge_bytes": {"E->L": 1e6}}})
    solution = max_throughput_on_topology(build_model(fat))
    assert solution.throughput == pytest.approx(30.0)
    assert all(sum(r.values()) <= 3 for r in solution.placement.values())
    # A 3-GPU node beside a 1-GPU node: 2 E + 2 L needs E's output to cross the link for 10 req/s.
    nodes = [{"name": "a", "gpus": 3}, {"name": "b", "gpus": 1}]
    wide = parse_spec({**base, "topology": {"nodes": nodes, "bandwidth": 1e12, "edge_bytes": {"E->L": 1e6}}})
    assert max_throughput_on_topology(build_model(wide)).throughput == pytest.approx(20.0)
    thin = parse_spec({**base, "topology": {"nodes": nodes, "bandwidth": 2e6, "edge_bytes": {"E->L": 1e6}}})
    # 10 req/s stay on node a; the 2 MB/s link carries 2 more req/s of 1 MB embeddings.
    assert max_throughput_on_topology(build_model(thin)).throughput == pytest.approx(12.0)


# --- CLI -------------------------------------------------------------------------------------------------

GOOD = {
    "components": ["E", "L"],
    "executors": [
        {"name": "E", "components": ["E"], "gpus": 1, "throughput": 20.0},
        {"name": "L", "components": ["L"], "gpus": 1, "throughput": 6.0},
        {"name": "EL", "components": ["E", "L"], "gpus": 1, "throughput": 4.0},
    ],
    "request_types": [
        {"name": "text", "components": ["L"], "share": 0.3},
        {"name": "image+text", "components": ["E", "L"], "share": 0.7},
    ],
}


def write(tmp_path, data, name="spec.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_cli_json_is_one_object_in_the_documented_shape(tmp_path, capsys):
    assert main(["plan", write(tmp_path, GOOD), "--target-rps", "30", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan == {
        "gpus": 7,
        "throughput": pytest.approx(30.0),
        "cells": [
            {"gpus": 4, "throughput": pytest.approx(18.0), "count": 1, "replicas": {"E": 1, "L": 3}},
            {"gpus": 1, "throughput": pytest.approx(4.0), "count": 3, "replicas": {"EL": 1}},
        ],
        "routing": {"text": {"L": pytest.approx(0.6), "EL": pytest.approx(0.4)}, "image+text": {"E->L": pytest.approx(0.6), "EL": pytest.approx(0.4)}},
    }
    assert main(["plan", write(tmp_path, GOOD), "--gpus", "8"]) == 0
    assert "plan: 8 GPUs, 36.000 req/s predicted" in capsys.readouterr().out


def mutate(change):
    data = json.loads(json.dumps(GOOD))
    change(data)
    return data


def no_path(d):
    d["executors"] = [d["executors"][0]]  # only the encoder: nothing runs L
    d["request_types"] = [{"name": "text", "components": ["L"], "share": 1.0}]


def out_of_order(d):
    d["request_types"][1]["paths"] = [["L", "E"]]


def big_llm(d):
    d["executors"][1]["gpus"] = 2
    del d["executors"][2]


@pytest.mark.parametrize(
    "data, args, message",
    [
        (mutate(no_path), ["--gpus", "4"], "request type 'text' has no valid path"),
        (mutate(out_of_order), ["--gpus", "4"], "path L->E does not run each of ['E', 'L'] exactly once in model order"),
        (mutate(lambda d: d["executors"][0].update(throughput=0)), ["--gpus", "4"], "executor 'E': throughput must be > 0 req/s, got 0"),
        (mutate(lambda d: d["executors"][1].update(throughput=-2)), ["--gpus", "4"], "executor 'L': throughput must be > 0"),
        (mutate(lambda d: d["request_types"][0].update(share=0.5)), ["--gpus", "4"], "shares must sum to 1, they sum to 1.2"),
        (mutate(big_llm), ["--gpus", "1", "--max-cell-exponent", "0"], "no cell of up to 1 GPUs can serve every request type"),
        (mutate(lambda d: d.update(extra=1)), ["--gpus", "4"], "extra: Extra inputs are not permitted"),
        (GOOD, ["--target-rps", "0"], "the target throughput must be > 0 req/s, got 0"),
        (GOOD, ["--gpus", "0"], "--gpus must be >= 1, got 0"),
    ],
)
def test_cli_bad_specs_exit_non_zero_with_one_line(tmp_path, capsys, data, args, message):
    code = main(["plan", write(tmp_path, data), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert "Traceback" not in err


def test_cli_budget_below_the_smallest_cell(tmp_path, capsys):
    data = mutate(lambda d: [e.update(gpus=2) for e in d["executors"]])
    assert main(["plan", write(tmp_path, data), "--gpus", "1"]) == 2
    assert "budget of 1 GPUs is below the smallest cell (2 GPUs)" in capsys.readouterr().err


def test_cli_reads_yaml_and_reports_unreadable_files(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text("components: [E, L\n")
    assert main(["plan", str(path), "--gpus", "2"]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "absent.yaml"), "--gpus", "2"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_target_plan_uses_no_more_gpus_than_needed():
    spec = parse_spec(GOOD)
    assert plan_for_target(spec, 18.0).gpus == 4
    assert plan_for_target(spec, 18.5).gpus == 5
