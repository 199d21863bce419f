"""`prismserve bench paper`: the README's paper tables are rebuilt from the results files alone."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from prismserve.bench.paper import rebuild
from prismserve.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = """# Benchmarks

<!-- bench-paper:rows -->
stale
<!-- /bench-paper -->

<!-- bench-paper:details:fig6a -->
stale
<!-- /bench-paper -->

<!-- bench-paper:details:not-an-experiment -->
kept as written
<!-- /bench-paper -->
"""


def checkout(tmp_path: Path) -> Path:
    """A checkout with the real experiments and README markers, its results copied."""
    ignore = shutil.ignore_patterns("*.png", "__pycache__")
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", ignore=ignore)
    (tmp_path / "benchmarks" / "README.md").write_text(README)
    return tmp_path


def test_tables_are_rebuilt_from_the_results_files(tmp_path, monkeypatch, capsys):
    root = checkout(tmp_path)
    result = root / "benchmarks" / "results" / "fig6a_table2_omni.json"
    data = json.loads(result.read_text())
    data["cells"]["8"]["speedup_over_monolith"] = 2.345  # a figure the table must now show
    result.write_text(json.dumps(data))
    monkeypatch.chdir(root / "benchmarks" / "paper")  # found from a folder inside the checkout
    assert main(["bench", "paper", "--tables-only"]) == 0
    readme = (root / "benchmarks" / "README.md").read_text()
    assert "stale" not in readme and "kept as written" in readme
    row = next(line for line in readme.splitlines() if line.startswith("| Fig 6a: Qwen2.5-Omni, 8 GPUs"))
    assert "| 3.09x | 2.35x" in row and "| 0.76 |" in row  # ours / paper computed from the file
    assert "| 8 | Monolith |" in readme  # fig6a's details block


def test_an_unknown_experiment_or_a_missing_checkout_is_a_clear_error(tmp_path, monkeypatch, capsys):
    root = checkout(tmp_path)
    assert main(["bench", "paper", "--root", str(root), "--only", "fig99"]) == 2
    assert "no experiment ['fig99']" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path.parent)
    assert main(["bench", "paper", "--tables-only"]) == 2
    assert "ship with the source checkout" in capsys.readouterr().err


def test_every_registered_experiment_gives_rows_from_the_committed_results():
    from prismserve.bench.paper import load_module, tables

    blocks = tables(ROOT, ROOT / "benchmarks" / "results")
    registry = load_module(ROOT / "benchmarks" / "paper" / "experiments.py")
    rows = [line for line in blocks["rows"].splitlines()[2:] if line.strip()]
    assert len(rows) >= len(registry.EXPERIMENTS)
    assert all(line.count("|") == 6 for line in rows)  # experiment, paper, ours, ratio, why
    assert not any("| not run |" in line for line in rows), "an experiment's results are not committed"


def test_rebuild_leaves_text_outside_the_markers_alone(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- bench-paper:rows -->\nold\n<!-- /bench-paper -->\nafter\n")
    assert rebuild(readme, {"rows": "new\n"}) == ["rows"]
    assert readme.read_text() == "before\n<!-- bench-paper:rows -->\nnew\n<!-- /bench-paper -->\nafter\n"


TOY_REGISTRY = """
from dataclasses import dataclass


@dataclass(frozen=True)
class Experiment:
    name: str
    script: str
    args: tuple = ()
    quick: tuple = ("--quick",)
    out: str = "--out"
    module: str = "toy_experiment.py"
    more: tuple = ()


EXPERIMENTS = [Experiment("toy", "toy_experiment.py", ("--value", "3"), more=(("--value", "4", "--name", "second"),))]
"""
TOY_SCRIPT = """
import argparse, json, sys
from pathlib import Path


def rows(results):
    values = [json.loads(p.read_text())["value"] for p in sorted(Path(results).glob("toy*.json"))]
    return [("toy", "1", " + ".join(map(str, values)), "-", "")]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--value", type=int, default=1)
    parser.add_argument("--name", default="first")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.value < 0:
        sys.exit("a failed experiment")
    (args.out / f"toy_{args.name}.json").write_text(json.dumps({"value": args.value}))
"""


def toy_checkout(tmp_path: Path) -> Path:
    paper = tmp_path / "benchmarks" / "paper"
    paper.mkdir(parents=True)
    (paper / "experiments.py").write_text(TOY_REGISTRY)
    (paper / "toy_experiment.py").write_text(TOY_SCRIPT)
    (tmp_path / "benchmarks" / "README.md").write_text("<!-- bench-paper:rows -->\n<!-- /bench-paper -->\n")
    return tmp_path


def test_an_experiment_runs_each_of_its_runs_then_its_rows_are_tabled(tmp_path):
    root = toy_checkout(tmp_path)
    assert main(["bench", "paper", "--root", str(root), "--only", "toy"]) == 0
    assert "| toy | 1 | 3 + 4 | - |" in (root / "benchmarks" / "README.md").read_text()


def test_a_failed_experiment_is_an_error_and_the_tables_still_come_from_the_files(tmp_path, capsys):
    root = toy_checkout(tmp_path)
    (root / "benchmarks" / "results").mkdir()
    (root / "benchmarks" / "results" / "toy_old.json").write_text('{"value": 7}')
    registry = (root / "benchmarks" / "paper" / "experiments.py").read_text().replace('"3"', '"-3"')
    (root / "benchmarks" / "paper" / "experiments.py").write_text(registry)
    assert main(["bench", "paper", "--root", str(root)]) == 1
    assert "these experiments failed: toy" in capsys.readouterr().err
    assert "| toy | 1 | 7 + 4 | - |" in (root / "benchmarks" / "README.md").read_text()


def test_a_script_named_like_a_package_does_not_stand_in_for_it(tmp_path):
    import toy  # the tests' package of toy components

    from prismserve.bench.paper import load_module

    (tmp_path / "toy.py").write_text("VALUE = 3\n")
    assert load_module(tmp_path / "toy.py").VALUE == 3
    assert sys.modules["toy"] is toy  # before the fix the script replaced the package here
