"""Run in the vLLM environment by `VLLMProbes` (tests/models/vllm_jobs.py): the probe jobs of a whole test
run, one after another in this one process, so that vLLM and the executors are imported once.

Each line of stdin is a probe script of this directory (`vllm_probe.py`, `vllm_thinker_probe.py`), the
pickle of its job and where to write its results, tab-separated; its `main(source, target)` runs. The
results are written (whole: renamed into place) before the probe shuts its engine down; a probe that
fails writes its traceback to `target + ".error"` instead.
"""

import asyncio
import importlib
import sys
import traceback
from pathlib import Path

# What every probe needs, imported while the test computes what the probe is checked against.
import vllm.v1.engine.async_llm  # noqa: F401

import prismserve.executors.vllm_llm  # noqa: F401
import prismserve.executors.vllm_thinker  # noqa: F401


def serve() -> None:
    for line in sys.stdin:
        probe, source, target = line.rstrip("\n").split("\t")
        try:
            asyncio.run(importlib.import_module(Path(probe).stem).main(source, target))
        except Exception:
            Path(target + ".error").write_text(traceback.format_exc())


if __name__ == "__main__":
    serve()
