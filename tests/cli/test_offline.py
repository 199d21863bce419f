"""Telemetry off by default, hub offline mode only when asked for, and replicas see what the server has."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from prismserve.cli import main
from prismserve.executors import envs
from prismserve.offline import HUB_OFFLINE, TELEMETRY_OFF, replica_env

WATCHED = (*TELEMETRY_OFF, *HUB_OFFLINE)


def python(code: str, **chosen: str) -> str:
    """The output of `code` run by a fresh Python, started with only `chosen` of the watched variables set."""
    env = {k: v for k, v in os.environ.items() if k not in WATCHED}
    env.update(chosen, PYTHONPATH=os.getcwd())
    command = [sys.executable, "-c", code]
    result = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def environment_after_import(**chosen: str) -> dict[str, str]:
    """The watched variables of a fresh process that imported prismserve, started with only `chosen` set."""
    probe = f"import json, os, prismserve; print(json.dumps({{k: os.environ.get(k) for k in {WATCHED!r}}}))"
    return {k: v for k, v in json.loads(python(probe, **chosen)).items() if v is not None}


def test_import_turns_telemetry_off_and_leaves_hub_offline_mode_unset():
    assert environment_after_import() == TELEMETRY_OFF


def test_import_keeps_the_users_hub_and_telemetry_settings():
    seen = environment_after_import(HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0", RAY_USAGE_STATS_ENABLED="1")
    chosen = {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "RAY_USAGE_STATS_ENABLED": "1"}
    assert seen == {**TELEMETRY_OFF, **chosen}


@pytest.mark.parametrize("offline", ["0", "1", None], ids=["online", "offline", "unset"])
def test_replicas_get_the_servers_hub_mode(offline, monkeypatch, tmp_path):
    for name in HUB_OFFLINE:
        if offline is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, offline)
    monkeypatch.setenv("PRISMSERVE_VLLM_PYTHON", sys.executable)  # any Python: only env_vars matter here
    expected = {} if offline is None else dict.fromkeys(HUB_OFFLINE, offline)
    for env_vars in (replica_env(), envs.runtime_env("vllm")["env_vars"]):
        assert {k: v for k, v in env_vars.items() if k in HUB_OFFLINE} == expected
        assert env_vars.items() >= TELEMETRY_OFF.items()


RAY_PROBE = """
import os, ray
from prismserve.runtime.cluster import connect

@ray.remote(num_cpus=0)
def hub_mode():
    return os.environ.get("HF_HUB_OFFLINE")

connect(os.environ["RAY_ADDRESS"])  # the test run's cluster: the job's workers get what connect passes
print(ray.get(hub_mode.remote()), os.environ.get("HF_HUB_OFFLINE"))
ray.shutdown()
"""


def test_a_ray_worker_sees_the_users_hub_mode(ray_cluster):
    assert python(RAY_PROBE, HF_HUB_OFFLINE="0", RAY_ADDRESS=ray_cluster.address).split() == ["0", "0"]


def test_serve_offline_flag_sets_hub_offline_mode_for_the_server(monkeypatch, capsys):
    for name in HUB_OFFLINE:
        monkeypatch.delenv(name, raising=False)
    assert main(["serve", "/no/such/app.py", "--offline"]) == 2  # the flag acts before the app is read
    assert {name: os.environ.get(name) for name in HUB_OFFLINE} == HUB_OFFLINE
