"""prismserve's vLLM plugin: what vLLM's own processes must know of prismserve, registered in each.

vLLM runs its engine core in spawned processes, so registering a model class in the replica's
process alone is not enough: vLLM calls the functions of the `vllm.general_plugins` entry point group
in every process it starts. `envs.py` declares `register` there (a small dist-info beside the
package link that is on the replica's `PYTHONPATH`). Cheap to import: the classes it registers are
named as strings and imported by vLLM only when a model needs them.
"""

from __future__ import annotations

EXTENSIONS = "prismserve.executors.vllm_extensions"
# The architecture Qwen2.5-Omni checkpoints declare; vLLM runs their thinker.
OMNI_ARCHITECTURE = "Qwen2_5OmniForConditionalGeneration"


def register() -> None:
    """Run the Qwen2.5-Omni thinker as `vllm_extensions.OmniThinker` (it can hand out hidden states)."""
    from vllm import ModelRegistry

    ModelRegistry.register_model(OMNI_ARCHITECTURE, f"{EXTENSIONS}:OmniThinker")
