"""A model's components laid onto fewer GPUs than it has components (`prismserve.serve.fit`)."""

from __future__ import annotations

import pytest

from prismserve.models import family_for, tiny
from prismserve.serve.fit import (
    GIB,
    GPU_USABLE,
    LLM_CACHE_GIB,
    FitError,
    component_needs,
    fit,
    fitted_shares,
    packed,
)

OMNI = ["image", "audio", "thinker", "talker", "vocoder"]
# Qwen2.5-Omni-7B's weights in bf16, roughly: the thinker's LLM 15.2 GB, the vision and audio
# towers 1.3 GB each, the talker 2.6 GB, the token2wav vocoder 0.9 GB.
OMNI_7B = {
    "": int(15.2e9),
    "image": int(1.3e9),
    "audio": int(1.3e9),
    "talker": int(2.6e9),
    "vocoder": int(0.9e9),
}


def on_gpus(shares: dict[str, float]) -> float:
    return sum(shares.values())


def test_an_llm_stage_holds_the_weights_no_other_component_claims_and_its_cache():
    needs = component_needs({"": 10 * GIB, "image": GIB}, ["image", "llm"])
    assert needs["llm"] == pytest.approx(10 * 1.2 + 0.5 + LLM_CACHE_GIB)
    assert needs["image"] == pytest.approx(1.2 + 0.5)


def test_on_one_gpu_every_component_shares_it_and_the_thinker_takes_the_rest():
    needs = component_needs(OMNI_7B, OMNI)
    shares = fit(needs, 1, 80)
    assert set(shares) == set(OMNI) and on_gpus(shares) <= GPU_USABLE + 1e-9
    for component in ("image", "audio", "talker", "vocoder"):
        assert needs[component] / 80 <= shares[component] < needs[component] / 80 + 0.01
    assert shares["thinker"] > needs["thinker"] / 80  # vLLM's KV cache fills what is left


def test_on_two_gpus_the_thinker_has_one_and_the_rest_share_the_other():
    """vLLM-Omni's two-GPU layout: the thinker alone; talker, vocoder and encoders together."""
    shares = fit(component_needs(OMNI_7B, OMNI), 2, 80)
    assert shares["thinker"] == pytest.approx(GPU_USABLE)
    assert on_gpus({c: s for c, s in shares.items() if c != "thinker"}) <= GPU_USABLE


def test_what_cannot_fit_is_said_at_once_with_what_each_component_needs():
    needs = component_needs(OMNI_7B, OMNI)
    with pytest.raises(FitError, match=r"thinker needs more than one GPU holds .* thinker 2\d\.\d GiB"):
        fit(needs, 4, 16)
    with pytest.raises(FitError, match=r"do not fit on 1 GPU of 24 GiB .* talker 3\.\d GiB"):
        fit(needs, 1, 24)


def test_with_a_gpu_per_component_nothing_is_shared():
    model = tiny.build("qwen2.5-omni")
    assert fitted_shares(family_for(str(model)), str(model), OMNI, 5, 80) == {}
    shares = fitted_shares(family_for(str(model)), str(model), OMNI, 1, 80)
    assert set(shares) == set(OMNI) and on_gpus(shares) <= GPU_USABLE + 1e-9


def test_a_stated_need_replaces_the_computed_one():
    """`--component-gib` (a longer context's KV cache, a measured footprint) decides the layout: a
    thinker stated at 60 GiB leaves no room for the others on its 80 GiB GPU."""
    computed = component_needs(OMNI_7B, OMNI)
    stated = component_needs(OMNI_7B, OMNI, {"thinker": 60.0, "talker": 2.0})
    assert stated == {**computed, "thinker": 60.0, "talker": 2.0}
    assert fit(computed, 2, 80) != fit(stated, 2, 80)
    with pytest.raises(FitError, match=r"do not fit on 1 GPU of 80 GiB .* thinker 75\.0 GiB"):
        fit(stated | {"thinker": 75.0}, 1, 80)
    with pytest.raises(
        FitError, match="component_gib names llm, which this model does not have; its components: image"
    ):
        component_needs(OMNI_7B, OMNI, {"llm": 10.0})


def test_planned_the_components_are_packed_onto_the_fewest_gpus_that_hold_them():
    """`serve MODEL --gpus N`: the profile measures the components packed so, and the planner may
    colocate them. The 7B Omni's five fit on one 80 GiB GPU; on 24 GiB GPUs the thinker takes one and
    the rest share another (vLLM-Omni's two-GPU layout); on 16 GiB GPUs the thinker needs more than
    one: each component keeps its own GPUs, no colocation is offered."""
    needs = component_needs(OMNI_7B, OMNI)
    assert packed(needs, 80) == (fit(needs, 1, 80), 1)
    shares, gpus = packed(needs, 24)
    assert gpus == 2 and shares == fit(needs, 2, 24) and shares["thinker"] > 0.9
    assert packed(needs, 16) == ({}, 0)
    assert packed(component_needs(OMNI_7B, OMNI, {"thinker": 80.0}), 80) == ({}, 0)
