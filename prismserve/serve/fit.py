"""A model's default app fitted onto fewer GPUs than it has components (`prismserve serve MODEL`).

Each component deployed whole takes a GPU: the Omni families' six, a vision LLM's two or three.
Where the cluster has fewer, each component gets a share of a GPU instead, from what it needs: its
weights (read from the checkpoint's safetensors headers) and a budget, stated here, for its
activations and, for the LLM stage, its KV cache. The components are packed onto the GPUs there
are, the LLM stage first and each onto the emptiest GPU with room, which puts the thinker on a GPU
of its own and the rest together on two GPUs, as vLLM-Omni's two-GPU configurations do; on one GPU
all share it. The LLM stage then takes what is left of its GPU (on vLLM its share is
`gpu_memory_utilization`: its KV cache fills it). A component too large for a GPU, or components
that do not fit together, are said at once, with what each needs.

Where the planner lays the app out for fewer GPUs than components (`--gpus N`), the components are
fitted onto the fewest GPUs that hold them (`planning_shares`): the profile measures them packed so and offers each packed
group as a colocated option beside each component's solo option (`profile.spec`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

GIB = 1 << 30
GPU_USABLE = 0.95
"""Of each GPU's memory, what the components may take (the rest: CUDA contexts, fragmentation)."""
LLM_CACHE_GIB = 4.0
"""An LLM stage's KV cache (and its sampler's buffers) beyond its weights."""
ACTIVATIONS = 0.2
"""Every component's activations and workspace, as a share of its weights ..."""
ACTIVATIONS_GIB = 0.5
"""... plus this much."""
DECLARED_GPU_GIB = 80.0
"""The memory assumed of a GPU this process cannot see (declared GPUs, a remote cluster's): an
A100's or H100's, the GPUs the papers serve these models on."""
LLM_STAGES = frozenset({"llm", "thinker", "prefill", "decode"})
"""Components that run the LLM: they hold the weights no encoder or generator claims."""


class FitError(ValueError):
    """The components cannot share the GPUs there are."""


def component_needs(
    weights: dict[str, int], components: list[str], stated: dict[str, float] | None = None
) -> dict[str, float]:
    """GiB each of `components` needs: its weights (an LLM stage's are those no other component's
    prefixes claim, `weights[""]`) with their activations, and an LLM stage's KV cache; or what
    `stated` gives it (`--component-gib`: a longer context's cache, a measured footprint)."""
    stated = stated or {}
    unknown = sorted(set(stated) - set(components))
    if unknown:
        raise FitError(
            f"component_gib names {', '.join(unknown)}, which this model does not have; its components: "
            f"{', '.join(components)}"
        )
    needs = {}
    for component in components:
        if component in stated:
            needs[component] = stated[component]
            continue
        llm = component in LLM_STAGES
        own = weights.get(component, weights.get("", 0) if llm else 0) / GIB
        needs[component] = own * (1 + ACTIVATIONS) + ACTIVATIONS_GIB + (LLM_CACHE_GIB if llm else 0.0)
    return needs


def fit(needs: dict[str, float], gpus: int, gpu_gib: float) -> dict[str, float]:
    """Each component's share of a GPU, the components packed onto `gpus` GPUs of `gpu_gib` GiB;
    a FitError naming what each needs when they do not fit."""
    room = gpu_gib * GPU_USABLE
    listed = ", ".join(f"{c} {n:.1f} GiB" for c, n in sorted(needs.items(), key=lambda item: -item[1]))
    too_large = sorted(c for c, n in needs.items() if n > room)
    if too_large:
        raise FitError(
            f"{', '.join(too_large)} need{'s' if len(too_large) == 1 else ''} more than one GPU holds "
            f"({room:.1f} of its {gpu_gib:g} GiB); the components need {listed}. Use larger GPUs, or give "
            "that component tensor parallelism (--tensor-parallel-size, vLLM)"
        )
    loads, placed = [0.0] * gpus, {}
    for component in sorted(needs, key=lambda c: (c not in LLM_STAGES, -needs[c])):
        fits = [g for g in range(gpus) if loads[g] + needs[component] <= room]
        if not fits:
            raise FitError(
                f"the components do not fit on {gpus} GPU{'s' if gpus > 1 else ''} of {gpu_gib:g} GiB "
                f"({room * gpus:.1f} GiB usable); they need {listed} ({sum(needs.values()):.1f} GiB). "
                "Add GPUs or use larger ones"
            )
        gpu = min(fits, key=lambda g: loads[g])
        loads[gpu] += needs[component]
        placed[component] = gpu
    shares = {c: math.ceil(needs[c] / gpu_gib * 100) / 100 for c in needs}
    for gpu in range(gpus):  # the LLM stages take what is left of their GPU, in proportion to their needs
        llms = [c for c, g in placed.items() if g == gpu and c in LLM_STAGES]
        left = GPU_USABLE - sum(shares[c] for c, g in placed.items() if g == gpu and c not in LLM_STAGES)
        total = sum(needs[c] for c in llms)
        for component in llms:
            shares[component] = math.floor(left * needs[component] / total * 100) / 100
    return shares


def gpu_memory_gib() -> float:
    """A GPU's memory: the first one this process sees, else `DECLARED_GPU_GIB`."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / GIB
    except ImportError:
        pass
    return DECLARED_GPU_GIB


def fitted_shares(
    family: Any,
    checkpoint: str,
    components: list[str],
    gpus: int,
    gpu_gib: float,
    stated: dict[str, float] | None = None,
) -> dict[str, float]:
    """Shares of a GPU for the default app's `components` on `gpus` GPUs, with the GiB `stated` for
    some of them; {} when each has a GPU."""
    if gpus >= len(components):
        return {}
    weights = family.adapter_class().component_bytes(Path(checkpoint))
    return fit(component_needs(weights, components, stated), gpus, gpu_gib)


def planning_shares(
    family: Any,
    checkpoint: str,
    components: list[str],
    gpu_gib: float,
    stated: dict[str, float] | None = None,
) -> tuple[dict[str, float], int]:
    """`packed` for the default app's `components`, with the GiB `stated` for some of them."""
    weights = family.adapter_class().component_bytes(Path(checkpoint))
    return packed(component_needs(weights, components, stated), gpu_gib)


def packed(needs: dict[str, float], gpu_gib: float) -> tuple[dict[str, float], int]:
    """Shares of a GPU for components needing `needs` GiB, packed onto the fewest GPUs of `gpu_gib`
    GiB that hold them, and that count: the colocations the planner is offered. ({}, 0) when they
    fit only one to a GPU or one needs more than a GPU holds: each keeps its own GPUs."""
    for gpus in range(1, len(needs)):
        try:
            return fit(needs, gpus, gpu_gib), gpus
        except FitError:
            continue
    return {}, 0
