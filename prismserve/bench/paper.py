"""`prismserve bench paper`: rerun the papers' experiments and rebuild benchmarks/README.md's tables.

The experiments live in a source checkout (`benchmarks/paper/`, listed in its `experiments.py`):
each is a script that writes JSON (and PNG plots) under a results folder, and a module whose
`rows(results)` reads those files back as README rows (paper, ours, ratio, why they differ) and
whose optional `details(results)` gives a markdown block. This command runs the chosen scripts,
one process each, then rewrites the README between its markers from the files alone, so no
figure in those tables is typed by hand:

    <!-- bench-paper:rows -->            every experiment's rows, one table
    <!-- bench-paper:details:NAME -->    NAME's details block
    <!-- /bench-paper -->                closes either
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROWS_HEAD = "| experiment | paper | ours | ours / paper | why they differ |\n|---|---|---|---|---|"
_BLOCK = re.compile(r"(<!-- bench-paper:(?P<name>[\w:.-]+) -->\n)(?P<body>.*?)(<!-- /bench-paper -->)", re.S)


def add_paper_command(sub: argparse._SubParsersAction) -> None:
    """Register `prismserve bench-paper` (reached as `prismserve bench paper`)."""
    paper = sub.add_parser(
        "bench-paper",
        help=argparse.SUPPRESS,
        prog="prismserve bench paper",
        description="Rerun the papers' experiments (benchmarks/paper in a source checkout) and rebuild "
        "the tables of benchmarks/README.md from their results.",
    )
    paper.add_argument("--only", nargs="+", metavar="NAME", help="run only these experiments (see --list)")
    paper.add_argument("--list", action="store_true", help="list the experiments and exit")
    paper.add_argument("--quick", action="store_true", help="each script's small run (a smoke test)")
    paper.add_argument(
        "--tables-only", action="store_true", help="run nothing: rebuild the README's tables from the results"
    )
    paper.add_argument("--results", type=Path, help="results folder (default: benchmarks/results)")
    paper.add_argument(
        "--root", type=Path, help="the source checkout (default: found from the current folder)"
    )
    paper.set_defaults(func=_paper)


def checkout(start: Path) -> Path:
    """The source checkout holding `benchmarks/paper/experiments.py`, at or above `start`."""
    for folder in (start, *start.parents):
        if (folder / "benchmarks" / "paper" / "experiments.py").is_file():
            return folder
    raise FileNotFoundError(
        f"no benchmarks/paper/experiments.py at or above {start}: the paper experiments ship with the "
        "source checkout (git clone the repository and run this inside it, or pass --root)"
    )


def load_module(path: Path) -> ModuleType:
    """Import a benchmark script by path, its folder first on sys.path (scripts import siblings).

    It is registered under a name of its own (dataclasses look their module up while it loads), so
    a script never stands in for a package of the same name.
    """
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = f"_bench_paper_{abs(hash(str(path.resolve())))}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run(root: Path, experiment: Any, results: Path, quick: bool) -> bool:
    """Run one experiment's script (each of its runs in its own process); True when all succeeded."""
    script = root / "benchmarks" / "paper" / experiment.script
    runs = [experiment.quick] if quick else [experiment.args, *getattr(experiment, "more", ())]
    ok = True
    for args in runs:
        command = [sys.executable, str(script), *args, experiment.out, str(results)]
        print(f"== {experiment.name}: {' '.join(command[1:])}", flush=True)
        start = time.monotonic()
        done = subprocess.run(command, cwd=script.parent, env=os.environ.copy(), check=False)
        print(
            f"== {experiment.name}: exit {done.returncode} after {time.monotonic() - start:.0f} s", flush=True
        )
        ok = ok and done.returncode == 0
    return ok


def rows_table(rows: Sequence[Sequence[str]]) -> str:
    """The README's rows table."""
    lines = [ROWS_HEAD] + ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def rebuild(readme: Path, blocks: dict[str, str]) -> list[str]:
    """Rewrite `readme`'s marked blocks from `blocks` (name -> markdown); the names rewritten."""
    text, done = readme.read_text(), []

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in blocks:
            return match[0]
        done.append(name)
        return match[1] + blocks[name].rstrip("\n") + "\n" + match[4]

    readme.write_text(_BLOCK.sub(replace, text))
    return done


def tables(root: Path, results: Path) -> dict[str, str]:
    """Every README block the experiments' results give (`rows` and `details:NAME`)."""
    registry = load_module(root / "benchmarks" / "paper" / "experiments.py")
    rows: list[Sequence[str]] = []
    blocks: dict[str, str] = {}
    for experiment in registry.EXPERIMENTS:
        module = load_module(root / "benchmarks" / "paper" / experiment.module)
        rows += module.rows(results)
        if hasattr(module, "details"):
            blocks[f"details:{experiment.name}"] = module.details(results)
    return {"rows": rows_table(rows), **blocks}


def _paper(args: argparse.Namespace) -> int:
    try:
        root = (args.root or checkout(Path.cwd())).resolve()
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    registry = load_module(root / "benchmarks" / "paper" / "experiments.py")
    names = [e.name for e in registry.EXPERIMENTS]
    if args.list:
        for experiment in registry.EXPERIMENTS:
            print(f"{experiment.name:22} {experiment.script} {' '.join(experiment.args)}")
        return 0
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        print(f"error: no experiment {unknown}; there are: {', '.join(names)}", file=sys.stderr)
        return 2
    results = (args.results or root / "benchmarks" / "results").resolve()
    results.mkdir(parents=True, exist_ok=True)
    failed = []
    if not args.tables_only:
        chosen = [e for e in registry.EXPERIMENTS if not args.only or e.name in args.only]
        failed = [e.name for e in chosen if not run(root, e, results, args.quick)]
    readme = root / "benchmarks" / "README.md"
    rebuilt = rebuild(readme, tables(root, results))
    print(f"rebuilt {len(rebuilt)} tables of {readme}: {', '.join(rebuilt)}")
    if failed:
        print(f"error: these experiments failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
