"""`prismserve plan`: the table, the JSON object, and one-line errors for infeasible or malformed specs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from prismserve.cli import main
from prismserve.planner import build_model, parse_spec, plan_cells

ROOT = Path(__file__).resolve().parents[2]

GOOD = {
    "components": ["E", "L"],
    "options": [
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


def test_json_is_one_object_in_the_documented_shape(tmp_path, capsys):
    assert main(["plan", write(tmp_path, GOOD), "--target-rps", "30", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan == {
        "gpus": 7,
        "throughput": pytest.approx(30.0),
        "max_cell_gpus": 64,
        "cells": [
            {"gpus": 4, "throughput": pytest.approx(18.0), "count": 1, "replicas": {"E": 1, "L": 3}},
            {"gpus": 1, "throughput": pytest.approx(4.0), "count": 3, "replicas": {"EL": 1}},
        ],
        "routing": {
            "text": {"L": pytest.approx(0.6), "EL": pytest.approx(0.4)},
            "image+text": {"E->L": pytest.approx(0.6), "EL": pytest.approx(0.4)},
        },
    }


def test_the_table_for_a_budget(tmp_path, capsys):
    assert main(["plan", write(tmp_path, GOOD), "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: 8 GPUs, 36.000 req/s predicted")
    assert "  count  GPUs      req/s  replicas per option\n" in out
    assert "      2     4     18.000  E x1, L x3" in out
    assert "  image+text: E->L 1.000" in out


def test_the_module_runs_as_a_command_on_the_worked_example():
    result = subprocess.run(
        [sys.executable, "-m", "prismserve", "plan", "docs/examples/internvl3.yaml", "--gpus", "8", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)  # exactly one JSON object
    assert plan["gpus"] <= 8 and plan["throughput"] > 0
    for paths in plan["routing"].values():
        assert sum(paths.values()) == pytest.approx(1.0)


def mutate(change):
    data = json.loads(json.dumps(GOOD))
    change(data)
    return data


def no_path(d):
    d["options"] = [d["options"][0]]  # only the encoder: nothing runs L
    d["request_types"] = [{"name": "text", "components": ["L"], "share": 1.0}]


def out_of_order(d):
    d["request_types"][1]["paths"] = [["L", "E"]]


def big_llm(d):
    d["options"][1]["gpus"] = 2
    del d["options"][2]


@pytest.mark.parametrize(
    "data, args, message",
    [
        (mutate(no_path), ["--gpus", "4"], "request type 'text' has no valid path"),
        (
            mutate(out_of_order),
            ["--gpus", "4"],
            "path L->E does not run each of ['E', 'L'] exactly once in model order",
        ),
        (
            mutate(lambda d: d["options"][0].update(throughput=0)),
            ["--gpus", "4"],
            "option 'E': throughput must be a finite number > 0 req/s, got 0",
        ),
        (
            mutate(lambda d: d["options"][1].update(throughput=-2)),
            ["--gpus", "4"],
            "option 'L': throughput must be a finite number > 0",
        ),
        (
            mutate(lambda d: d["options"].pop(0)),
            ["--gpus", "4"],
            "component 'E' has no option that runs it alone",
        ),
        (
            mutate(big_llm),
            ["--gpus", "1", "--max-cell-exponent", "0"],
            "no cell of up to 1 GPUs can serve every request type",
        ),
        # E (1 GPU) and L (2 GPUs): an instance needs 3 GPUs, the smallest cell 4.
        (
            mutate(big_llm),
            ["--gpus", "2"],
            "budget of 2 GPUs holds no complete instance of the model, which needs at least 3 GPUs",
        ),
        (
            mutate(lambda d: d["request_types"][0].update(share=-0.5)),
            ["--gpus", "4"],
            "request type 'text': share must be > 0, got -0.5",
        ),
        (
            mutate(lambda d: d.update(max_cell_gpus=48)),
            ["--gpus", "4"],
            "max_cell_gpus must be a power of two (the largest cell's GPUs), got 48; use 32 or 64",
        ),
        (mutate(lambda d: d.update(extra=1)), ["--gpus", "4"], "extra: Extra inputs are not permitted"),
        (GOOD, ["--target-rps", "0"], "--target-rps must be a finite number > 0, got 0.0"),
        (GOOD, ["--target-rps", "inf"], "--target-rps must be a finite number > 0, got inf"),
        (GOOD, ["--gpus", "0"], "--gpus must be at least 1, got 0"),
        (GOOD, ["--gpus", "4", "--topology"], "needs a `topology` section"),
        (
            GOOD,
            ["--gpus", "4", "--current", "plan.json"],
            "--current re-plans for a new target: give --target-rps too",
        ),
    ],
)
def test_bad_specs_and_requests_exit_non_zero_with_one_line(tmp_path, capsys, data, args, message):
    code = main(["plan", write(tmp_path, data), *args])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert message in captured.err
    assert "Traceback" not in captured.err


def test_unreadable_and_invalid_files(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text("components: [E, L\n")
    assert main(["plan", str(path), "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and err.count("\n") == 1
    assert main(["plan", str(tmp_path / "absent.yaml"), "--gpus", "2"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_goal_is_required_and_exclusive(tmp_path, capsys):
    spec = write(tmp_path, GOOD)
    with pytest.raises(SystemExit) as missing:
        main(["plan", spec])
    assert missing.value.code == 2
    with pytest.raises(SystemExit) as both:
        main(["plan", spec, "--gpus", "2", "--target-rps", "3"])
    assert both.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_replanning_from_a_running_plan(tmp_path, capsys):
    spec = write(tmp_path, GOOD)
    assert main(["plan", spec, "--target-rps", "30", "--json"]) == 0
    current = tmp_path / "current.json"
    current.write_text(capsys.readouterr().out)
    assert main(["plan", spec, "--target-rps", "40", "--current", str(current), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    summary = {k: [(c["gpus"], c["count"]) for c in v] for k, v in out["changes"].items()}
    assert summary == {"keep": [(4, 1), (1, 1)], "add": [(4, 1)], "remove": [(1, 2)]}
    assert main(["plan", spec, "--target-rps", "40", "--current", str(current)]) == 0
    table = capsys.readouterr().out
    assert "keep (identical cells stay up):" in table and "remove:" in table


def test_topology_plan_lists_nodes(tmp_path, capsys):
    data = {
        **GOOD,
        "topology": {
            "nodes": [{"name": "a", "gpus": 2}, {"name": "b", "gpus": 2}],
            "bandwidth": 1e9,
            "edge_bytes": {"E->L": 1e6},
        },
    }
    assert main(["plan", write(tmp_path, data), "--gpus", "4", "--topology", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["gpus"] <= 4 and {c["node"] for c in plan["cells"]} <= {"a", "b"}
    assert sum(c["gpus"] for c in plan["cells"]) == plan["gpus"]
    assert main(["plan", write(tmp_path, data), "--gpus", "4", "--topology"]) == 0
    assert "nodes:" in capsys.readouterr().out


def test_the_spec_sets_the_largest_cell_and_the_flag_overrides_it(tmp_path, capsys):
    spec = write(tmp_path, {**GOOD, "max_cell_gpus": 2})
    assert main(["plan", spec, "--gpus", "8", "--json"]) == 0
    capped = json.loads(capsys.readouterr().out)
    assert capped["max_cell_gpus"] == 2 and max(c["gpus"] for c in capped["cells"]) <= 2
    assert main(["plan", spec, "--gpus", "8", "--max-cell-exponent", "3", "--json"]) == 0
    wider = json.loads(capsys.readouterr().out)
    assert wider["max_cell_gpus"] == 8 and wider["throughput"] > capped["throughput"]
    assert main(["plan", spec, "--gpus", "8"]) == 0
    header = (
        f"plan: {capped['gpus']} GPUs, {capped['throughput']:.3f} req/s predicted (cells of up to 2 GPUs)\n"
    )
    assert capsys.readouterr().out.startswith(header)


def test_plans_over_ten_thousand_gpus_warn_and_absurd_targets_are_refused(tmp_path, capsys):
    spec = write(tmp_path, GOOD)
    assert main(["plan", spec, "--target-rps", "30", "--json"]) == 0
    assert capsys.readouterr().err == ""
    largest = plan_cells(build_model(parse_spec(GOOD)), 6)[-1]
    copies = 20_000 // largest.gpus + 1  # just over 20,000 GPUs of the most efficient cell
    assert main(["plan", spec, "--target-rps", repr(copies * largest.throughput), "--json"]) == 0
    captured = capsys.readouterr()
    gpus = copies * largest.gpus
    assert json.loads(captured.out)["gpus"] == gpus
    assert captured.err == (
        f"warning: this plan needs {gpus:,} GPUs (over 10,000); check the target and the spec's throughputs\n"
    )
    assert main(["plan", spec, "--target-rps", "1e9"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    needed = math.ceil(1e9 / largest.throughput * largest.gpus)
    assert captured.err.startswith(f"error: a target of 1e+09 req/s needs at least {needed:,} GPUs")
    assert "more than the planner's limit of 1,000,000" in captured.err
