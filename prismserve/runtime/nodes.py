"""What every node of the cluster needs before a model's replicas start there, checked on each node.

A replica placed on a node without the package, the vLLM environment or the model would fail only
once it starts there, minutes later and with an error from deep inside Ray or vLLM. So before an
app of real models places its cells, one task on each alive node checks what that node's replicas
will need (`node_problems`), and registration is refused naming each node and what it lacks
(docs/deploy.md, "Several nodes").
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import prismserve
from prismserve.errors import EnvironmentMissing

CHECK_TIMEOUT_S = 120.0  # a node starts a worker process for its check


@dataclass(frozen=True)
class NodeNeeds:
    """What a replica of the app needs on whichever node it lands: this driver's versions (replicas
    exchange pickled tasks with it), paths its runtime environment names (vLLM's Python), the
    folder linking to the package that an executor environment imports it from, and the
    checkpoints of its real models (directories or hub ids)."""

    prismserve: str
    ray: str
    paths: dict[str, str] = field(default_factory=dict)  # what it is -> path
    package_link: str | None = None
    models: tuple[str, ...] = ()


def node_problems(needs: NodeNeeds) -> list[str]:
    """What this node lacks of `needs` (run on the node)."""
    found = []
    for name, wanted in (("prismserve", needs.prismserve), ("ray", needs.ray)):
        have = importlib.metadata.version(name)
        if have != wanted:
            found.append(f"{name} {have} is installed, the server has {wanted}: install the same version")
    found += [f"no {what} at {path}" for what, path in needs.paths.items() if not Path(path).exists()]
    if needs.package_link is not None:
        from prismserve.executors.envs import _package_link

        here = str(_package_link())  # made here if missing: the folder of this node's package
        if here != needs.package_link:
            found.append(
                f"prismserve is installed at {Path(prismserve.__file__).parent}, not at the server's "
                "path: executor environments import it from the same path on every node"
            )
    found += [problem for model in needs.models if (problem := _model_problem(model))]
    return found


def _model_problem(model: str) -> str | None:
    """Why a replica here could not load `model`: a directory that is not here, or a hub id that is
    neither in this node's hub cache nor downloadable (the hub offline here)."""
    if model.startswith(("/", ".", "~")):
        return None if Path(model).expanduser().is_dir() else f"no model directory {model}"
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.HF_HUB_OFFLINE or isinstance(try_to_load_from_cache(model, "config.json"), str):
        return None
    return (
        f"model {model} is not in the hub cache ({constants.HF_HUB_CACHE}) and the hub is offline "
        "(HF_HUB_OFFLINE): download it there or mount the cache"
    )


def needs_of(models: list[str], runtime_envs: list[dict[str, Any] | None]) -> NodeNeeds:
    """The needs of replicas of `models` started with `runtime_envs` (Ray runtime environments)."""
    paths, link = {}, None
    for env in runtime_envs:
        if env and env.get("py_executable"):
            paths["executor environment's Python (`prismserve vllm-env` builds it)"] = env["py_executable"]
        link = (env or {}).get("env_vars", {}).get("PYTHONPATH") or link
    return NodeNeeds(
        prismserve=importlib.metadata.version("prismserve"),
        ray=importlib.metadata.version("ray"),
        paths=paths,
        package_link=link,
        models=tuple(sorted(set(models))),
    )


async def check_nodes(needs: NodeNeeds, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Run `node_problems` on every alive node of the connected Ray cluster; raise
    `EnvironmentMissing` naming each node that lacks something, and what."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n["Alive"]]
    check = ray.remote(num_cpus=0, max_retries=0)(node_problems)
    refs = [
        check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            needs
        )
        for n in nodes
    ]
    results = await asyncio.wait_for(asyncio.gather(*refs, return_exceptions=True), timeout_s)
    lacking = []
    for node, result in zip(nodes, results, strict=True):
        if isinstance(result, BaseException):  # e.g. no prismserve to unpickle the check with
            result = [f"the check could not run ({type(result).__name__}): is prismserve installed there?"]
        if result:
            lacking.append(f"node {_name(node)}: {'; '.join(result)}")
    if lacking:
        raise EnvironmentMissing(
            "some nodes of the cluster cannot run this app's replicas. "
            + ". ".join(lacking)
            + ". Each node needs the package, the vLLM environment and the models (docs/deploy.md)"
        )


def _name(node: dict[str, Any]) -> str:
    """A node as an operator knows it: its declared name, else its address, with its id's start."""
    from prismserve.runtime.pool import NODE_RESOURCE

    names = [key[len(NODE_RESOURCE) :] for key in node["Resources"] if key.startswith(NODE_RESOURCE)]
    return f"{names[0] if names else node['NodeManagerAddress']} ({node['NodeID'][:8]})"
