"""`prismserve plan SPEC --gpus N --by-replay TRACE`: the MILP's plan and Algorithm 2's layout, both replayed."""

from __future__ import annotations

import json

from test_replay import COSTS, trace

from prismserve.cli import main
from prismserve.planner.replay import goodput, hybrid_layout, layout_name

# One-GPU options of an E/P/D model; the MILP's rates (requests/s) are from COSTS at ~600-token prompts:
# prefill ~0.09 s a request, decode ~0.02 s, encode ~0.005 s.
SPEC = {
    "components": ["E", "P", "D"],
    "options": {
        "E": {"components": ["E"], "gpus": 1, "throughput": 180.0},
        "P": {"components": ["P"], "gpus": 1, "throughput": 11.0},
        "D": {"components": ["D"], "gpus": 1, "throughput": 45.0},
        "EP": {"components": ["E", "P"], "gpus": 1, "throughput": 10.4},
        "PD": {"components": ["P", "D"], "gpus": 1, "throughput": 8.9},
        "EPD": {"components": ["E", "P", "D"], "gpus": 1, "throughput": 8.5},
    },
    "request_types": {"image": {"components": ["E", "P", "D"], "share": 1.0}},
    "stages": COSTS.model_dump(),
}

# Long enough that every layout's queue outgrows the TTFT SLO at a finite rate.
REQUESTS = 1000


def files(tmp_path, spec=SPEC):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    trace_path = tmp_path / "trace.jsonl"
    rows = [
        {
            "arrival_s": r.arrival_s,
            "text_tokens": r.text_tokens,
            "output_tokens": r.output_tokens,
            "images": [[336, 336]],
        }
        for r in trace(REQUESTS)
    ]
    trace_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(spec_path), str(trace_path)


def test_json_gives_both_layouts_with_their_replayed_goodput(tmp_path, capsys):
    spec, trace_path = files(tmp_path)
    assert main(["plan", spec, "--gpus", "8", "--by-replay", trace_path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    replay = data["replay"]
    # The MILP's layout is its plan's replicas, and its goodput is what the replay gives that layout.
    replicas: dict[str, int] = {}
    for cell in data["cells"]:
        for name, n in cell["replicas"].items():
            replicas[name] = replicas.get(name, 0) + n * cell["count"]
    assert replay["milp"]["layout"] == replicas and sum(replicas.values()) == 8
    work = trace(REQUESTS)
    assert replay["milp"]["goodput_per_gpu"] == goodput(work, replicas, COSTS)
    choice = hybrid_layout(work, COSTS, 8)
    assert replay["hybrid"]["layout"] == choice.layout
    assert replay["hybrid"]["goodput_per_gpu"] == choice.goodput > 0
    assert replay["hybrid"]["name"] == layout_name(choice.layout)
    assert len(replay["hybrid"]["candidates"]) == 3


def test_table_prints_both_plans(tmp_path, capsys):
    spec, trace_path = files(tmp_path)
    assert main(["plan", spec, "--gpus", "8", "--by-replay", trace_path]) == 0
    out = capsys.readouterr().out
    assert "plan: 8 GPUs" in out and f"by trace replay ({REQUESTS} requests" in out
    assert "MILP plan" in out and "replay (Algorithm 2)" in out and "candidates:" in out


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    spec, trace_path = files(tmp_path)
    assert main(["plan", spec, "--target-rps", "5", "--by-replay", trace_path]) == 2
    assert (
        capsys.readouterr().err
        == "error: --by-replay lays out a number of GPUs: give --gpus, not --target-rps\n"
    )
    bare, _ = files(tmp_path / "..", {k: v for k, v in SPEC.items() if k != "stages"})
    assert main(["plan", bare, "--gpus", "8", "--by-replay", trace_path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --by-replay needs the spec's `stages`") and err.count("\n") == 1
    assert main(["plan", spec, "--gpus", "8", "--by-replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl: cannot read the trace" in capsys.readouterr().err
