"""The check of what each node needs before a model's replicas start there (runtime/nodes.py): on
this process's files, and on nodes of the session's simulated cluster with hub caches of their own."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from huggingface_hub import constants

import prismserve
from prismserve.errors import EnvironmentMissing
from prismserve.runtime.nodes import needs_of, node_problems
from prismserve.runtime.pool import NODE_RESOURCE

APP = """
from pydantic import BaseModel
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib.units import LLMTask

llm = LLMTask(model="prismserve-test/tiny-cached")

class Config(AppConfig):
    tasks = {"llm": llm}

class Answer(BaseModel):
    text: str

async def serve(request: ChatRequest) -> Answer:
    return Answer(text="")
"""


def test_a_node_lacking_paths_models_or_the_servers_versions_is_told_each(tmp_path, monkeypatch):
    from prismserve.executors.envs import _package_link

    python = tmp_path / "env" / "bin" / "python"
    elsewhere = [{"py_executable": str(python), "env_vars": {"PYTHONPATH": str(tmp_path / "links")}}]
    needs = needs_of([str(tmp_path / "no-model"), str(tmp_path)], elsewhere)
    assert node_problems(needs) == [
        f"no executor environment's Python (`prismserve vllm-env` builds it) at {python}",
        f"prismserve is installed at {Path(prismserve.__file__).parent}, not at the server's path: "
        "executor environments import it from the same path on every node",
        f"no model directory {tmp_path / 'no-model'}",
    ]
    python.parent.mkdir(parents=True)
    python.write_text("")
    (tmp_path / "no-model").mkdir()
    same = [{"py_executable": str(python), "env_vars": {"PYTHONPATH": str(_package_link())}}]
    needs = needs_of([str(tmp_path / "no-model")], same)
    assert node_problems(needs) == []
    older = dataclasses.replace(needs, prismserve="0.0.1")
    assert node_problems(older) == [
        f"prismserve {needs.prismserve} is installed, the server has 0.0.1: install the same version"
    ]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (problem,) = node_problems(dataclasses.replace(needs, models=("org/absent",)))
    assert "org/absent is not in the hub cache" in problem and "HF_HUB_OFFLINE" in problem
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # it downloads it
    assert node_problems(dataclasses.replace(needs, models=("org/absent",))) == []


def _hub_cache_with(path, repo: str) -> str:
    """A hub cache holding `repo`'s config, as a download leaves it."""
    folder = path / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return str(path)


@pytest.mark.slow
def test_registration_names_the_nodes_that_lack_the_model_before_any_replica_starts(ray_cluster, tmp_path):
    """Two nodes join, offline, one with the model in its hub cache and one without: registering
    an app of that model is refused at once, naming the bare node (and the session's nodes, which
    lack it too) but not the stocked one, and no replica was started."""
    from prismserve.runtime.ray_runtime import RayRuntime

    stocked_cache = _hub_cache_with(tmp_path / "stocked", "prismserve-test/tiny-cached")
    (tmp_path / "bare").mkdir()
    joined = [
        ray_cluster.add_node(
            num_cpus=1,
            resources={f"{NODE_RESOURCE}{name}": 1},
            env_vars={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": cache},
        )
        for name, cache in (("stocked", stocked_cache), ("bare", str(tmp_path / "bare")))
    ]
    ray_cluster.wait_for_nodes()

    async def main():
        runtime = RayRuntime()
        await runtime.start()
        try:
            with pytest.raises(EnvironmentMissing) as refused:
                await runtime.register_app(APP, "tiny")
            return str(refused.value), runtime.status()
        finally:
            await runtime.close()

    try:
        message, status = asyncio.run(main())
    finally:
        for node in joined:
            ray_cluster.remove_node(node)
    assert "node bare (" in message and "prismserve-test/tiny-cached is not in the hub cache" in message
    assert "node stocked" not in message
    assert status["cells"] == [] and "tiny" not in status["apps"]
