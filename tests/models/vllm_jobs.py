"""Running a probe script in the vLLM environment, with the Python and paths its replicas get."""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path
from typing import Any

from prismserve.executors import envs


def run_in_vllm_env(probe: str, job: dict[str, Any], tmp_path: Path, timeout: float = 600) -> Any:
    """What `tests/runtime/{probe}` (a script run with the vLLM environment's Python, as replicas are)
    writes for `job`: both travel as pickles."""

    source, target = tmp_path / "job.pkl", tmp_path / "out.pkl"
    source.write_bytes(pickle.dumps(job))
    env = envs.runtime_env("vllm")
    script = Path(__file__).parents[1] / "runtime" / probe
    subprocess.run(
        [env["py_executable"], str(script), str(source), str(target)],
        env={**os.environ, **env["env_vars"]},
        check=True,
        timeout=timeout,
    )
    return pickle.loads(target.read_bytes())
