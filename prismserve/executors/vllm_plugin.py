"""prismserve's vLLM plugin: what vLLM's own processes must know of prismserve, registered in each.

vLLM runs its engine core in spawned processes, so registering a model class in the replica's
process alone is not enough: vLLM calls the functions of the `vllm.general_plugins` entry point group
in every process it starts. `envs.py` declares `register` there (a small dist-info beside the
package link that is on the replica's `PYTHONPATH`). Cheap to import: the classes it registers are
named as strings and imported by vLLM only when a model needs them.
"""

from __future__ import annotations

EXTENSIONS = "prismserve.executors.vllm_extensions"
# Architectures checkpoints declare -> the class that runs them instead of vLLM's own.
MODELS = {
    "Qwen2_5OmniForConditionalGeneration": "OmniThinker",  # its hidden states; images as embeddings
    "Qwen3OmniMoeForConditionalGeneration": "Qwen3OmniThinker",  # images as embeddings
    "Gemma3ForConditionalGeneration": "Gemma3Embeds",  # images as embeddings
}


def register() -> None:
    """Run the architectures of `MODELS` with prismserve's subclasses of vLLM's classes."""
    from vllm import ModelRegistry

    for architecture, name in MODELS.items():
        ModelRegistry.register_model(architecture, f"{EXTENSIONS}:{name}")
