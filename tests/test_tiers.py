"""Test tiers: each test is marked by what it uses (tests/tiers.py), and `slow` with it, as collection
marks the real test files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiers import uses

TESTS = Path(__file__).resolve().parent

# Collect the files in a fresh pytest (the conftest hook marks them); print each test's marks.
COLLECT = """
import json, sys
import pytest

class Marks:
    def pytest_collection_finish(self, session):
        self.marks = {i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in session.items}

marks = Marks()
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[marks])
print("MARKS " + json.dumps(marks.marks))
sys.exit(code)
"""

FILES = {
    "planner": "planner/test_milp.py",  # pure planner tests
    "ray": "runtime/test_ray_runtime.py",  # the `ray_cluster` fixture
    "commands": "gateway/test_commands.py",  # `serving` (a serve subprocess), some on the cluster
    "vllm": "models/test_vllm_llm.py",  # `vllm_probes`, a session fixture of another conftest
    "bench": "benchmarks/test_scripts_run.py",  # the module's `bench_script` mark
}


@pytest.fixture(scope="module")
def marks() -> dict[str, set[str]]:
    """Each test of `FILES` and its marks, as a collection of those files marks them."""
    result = subprocess.run(
        [sys.executable, "-c", COLLECT, *(str(TESTS / f) for f in FILES.values())],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")]),
        },
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("MARKS ")]
    return {nodeid: set(names) for nodeid, names in json.loads(line.removeprefix("MARKS ")).items()}


def of(marks: dict[str, set[str]], file: str) -> dict[str, set[str]]:
    """The tests of `FILES[file]` (by name) and their marks."""
    prefix = f"tests/{FILES[file]}::"
    found = {
        nodeid.removeprefix(prefix): names for nodeid, names in marks.items() if nodeid.startswith(prefix)
    }
    assert found, f"no test collected from {FILES[file]}"
    return found


def test_planner_tests_are_quick(marks):
    assert all(
        not names & {"slow", "ray", "vllm", "serve", "bench_script"}
        for names in of(marks, "planner").values()
    )


def test_tests_on_the_ray_cluster_are_slow(marks):
    assert all({"ray", "slow"} <= names for names in of(marks, "ray").values())


def test_tests_that_start_a_serve_subprocess_are_slow_and_the_others_of_their_module_quick(marks):
    commands = of(marks, "commands")
    serve = {name for name, names in commands.items() if "serve" in names}
    assert serve == {
        "test_serve_in_process_runs_the_apps_real_executors_and_exits_cleanly_when_stopped[ctrl-c]",
        "test_serve_in_process_runs_the_apps_real_executors_and_exits_cleanly_when_stopped[sigterm]",
        "test_serve_on_ray_exits_0_after_a_clean_stop_by_sigterm",
    }
    assert all("slow" in commands[name] for name in serve)
    assert (
        "ray" in commands["test_serve_on_ray_exits_0_after_a_clean_stop_by_sigterm"]
    )  # it joins the cluster
    assert (
        "ray"
        not in commands[
            "test_serve_in_process_runs_the_apps_real_executors_and_exits_cleanly_when_stopped[ctrl-c]"
        ]
    )
    assert commands["test_register_list_invoke_unregister"].isdisjoint({"slow", "ray", "serve"})


def test_a_fixture_marks_the_tests_that_use_it(marks):
    assert all({"vllm", "slow"} <= names for names in of(marks, "vllm").values())


def test_a_marker_written_on_a_module_makes_its_tests_slow(marks):
    assert all({"bench_script", "slow"} <= names for names in of(marks, "bench").values())


def test_a_tier_must_be_one_of_the_known():
    with pytest.raises(ValueError, match="unknown test tiers \\['gpu'\\]"):
        uses("gpu")
