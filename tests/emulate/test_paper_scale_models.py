"""Qwen3-Omni and Qwen2.5-VL-32B emulations (000 Figures 6b, 7, 9, 10) and the memory model."""

from __future__ import annotations

import pytest

from prismserve.app import load_app_source
from prismserve.bench.workloads import Arrivals, RequestSpec, controlled, servegen
from prismserve.emulate import DEPLOYMENT_PREFIX, INTERNVL3, QWEN3_OMNI, QWEN25_VL
from prismserve.emulate.app import app_source
from prismserve.emulate.catalog import MLLM_BASELINES, OMNI_BASELINES
from prismserve.emulate.costs import GPU_MEMORY_GB, RESERVED_GB, Qwen3OmniCosts, qwen3_image_tokens
from prismserve.emulate.model import EmulatedOption
from prismserve.planner import plan_for_budget

STANDARD = RequestSpec(0.0, 1000, 300, images=((1920, 1080),))


@pytest.fixture(scope="module")
def any_to_any() -> list[RequestSpec]:
    return servegen(Arrivals("poisson", 1.0), count=400, any_to_any=True, seed=0)


def test_qwen25_vl_reproduces_table_1_at_the_standard_request():
    spec = QWEN25_VL.planner_spec([STANDARD] * 4)
    work = QWEN25_VL.costs.work(STANDARD)
    throughput = {o.name: o.throughput for o in spec.options}
    assert throughput["E"] == pytest.approx(12.04)  # 000 Table 1, image input
    assert 1 / (work["P"] + work["D"]) == pytest.approx(0.32)  # 000 Table 1, text in/out
    assert throughput["PD"] == pytest.approx(1.8 * 0.32)  # on 2 GPUs at TP speed 1.8
    # The same LLM as InternVL3's: one prefill rate; the encoder 10x faster per image than InternVL3's 6B.
    assert QWEN25_VL.costs.PREFILL_S_PER_TOKEN == INTERNVL3.costs.PREFILL_S_PER_TOKEN
    assert work["E"] < INTERNVL3.costs.work(STANDARD)["E"] / 10


def test_memory_is_weights_and_kv_of_a_full_batch_at_the_longest_context_split_over_tp():
    costs = Qwen3OmniCosts()
    longest = {"L": 10_000}
    one = costs.memory_gb(("L",), gpus=1, batch=8, longest=longest)
    kv = 8 * 10_000 * costs.KV_BYTES_PER_TOKEN["L"] / 1e9
    assert one == pytest.approx(costs.WEIGHTS_GB["L"] + kv + RESERVED_GB)
    assert costs.memory_gb(("L",), gpus=2, batch=8, longest=longest) == pytest.approx(
        (costs.WEIGHTS_GB["L"] + kv) / 2 + RESERVED_GB
    )
    # A model without a memory model has no out-of-memory options.
    assert INTERNVL3.out_of_memory([STANDARD]) == {}


def test_qwen3_omni_monolith_is_out_of_memory_and_the_plans_avoid_it(any_to_any):
    oom = QWEN3_OMNI.out_of_memory(any_to_any)
    assert set(oom) == {"Monolith"} and "out of memory" in oom["Monolith"]
    assert QWEN3_OMNI.memory_gb(QWEN3_OMNI.option("Monolith"), any_to_any) > GPU_MEMORY_GB
    # The thinker alone on one GPU leaves under 20 GB beside its weights: why its options use TP 2.
    single = EmulatedOption(name="L1", components=("L",), max_batch=8)
    assert GPU_MEMORY_GB - QWEN3_OMNI.costs.WEIGHTS_GB["L"] - RESERVED_GB < 20
    assert (
        QWEN3_OMNI.memory_gb(single, any_to_any)
        > 2 * QWEN3_OMNI.memory_gb(QWEN3_OMNI.option("L"), any_to_any) - 5
    )
    spec = QWEN3_OMNI.planner_spec(any_to_any)
    assert "Monolith" not in {o.name for o in spec.options}
    with pytest.raises(ValueError, match="cannot serve"):
        QWEN3_OMNI.restricted(spec, OMNI_BASELINES["Monolith"])
    for gpus in (8, 16):
        plan = plan_for_budget(spec, gpus, max_exponent=gpus.bit_length() - 1)
        used = {n for cell in plan.cells for n, r in cell.replicas.items() if r}
        assert plan.throughput > 0 and "Monolith" not in used
        assert used & {"L", "IVAL"} and used & {"T", "TC"}  # a thinker, and a talker for audio requests


def test_qwen3_omni_monolith_would_fit_without_its_static_batch_of_long_contexts(any_to_any):
    # The OOM comes from 8 requests padded to the longest context, not the weights (71 GB of 80).
    monolith = QWEN3_OMNI.option("Monolith")
    longest = {"L": 0, "T": 0}
    for spec in any_to_any:
        for c, tokens in QWEN3_OMNI.costs.context_tokens(spec).items():
            longest[c] = max(longest[c], tokens)
    assert longest["L"] > 10_000  # images, a 10,000-token video and text
    costs = QWEN3_OMNI.costs
    assert costs.memory_gb(monolith.components, 1, 0, longest) < GPU_MEMORY_GB
    assert costs.memory_gb(monolith.components, 1, 1, longest) < GPU_MEMORY_GB
    assert costs.memory_gb(monolith.components, 1, monolith.max_batch, longest) > GPU_MEMORY_GB


def test_qwen3_omni_work_follows_its_architecture():
    costs = Qwen3OmniCosts()
    text = RequestSpec(0.0, 500, 129)
    speech = RequestSpec(0.0, 500, 129, audio_out=True)
    assert costs.needs(text) == ("L",) and costs.needs(speech) == ("L", "T", "C")
    base = costs.BASE
    assert costs.work(text)["L"] == pytest.approx(1 / base.THROUGHPUT["L"] * costs.THINKER_RATIO)
    frames = 129 * costs.SPEECH_S_PER_TEXT_TOKEN * costs.CODEC_FRAME_HZ
    assert costs.work(speech)["T"] == pytest.approx(
        frames * costs.STEPS_PER_FRAME * costs.DECODE_STEP_S / costs.TALKER_BATCH
    )
    assert qwen3_image_tokens(1920, 1080) == 60 * 34
    doubled = RequestSpec(0.0, 500, 258, audio_out=True)
    assert costs.work(doubled)["T"] == pytest.approx(2 * costs.work(speech)["T"])


@pytest.mark.parametrize("model", [QWEN3_OMNI, QWEN25_VL])
def test_new_models_deploy_on_their_apps_unit_tasks(model, any_to_any):
    workload = any_to_any if model is QWEN3_OMNI else controlled(1.0, (1920, 1080), 1.0, 100, 100, count=100)
    app = load_app_source(app_source(model.name), model.name)
    plan = plan_for_budget(model.planner_spec(workload), 16, max_exponent=4)
    deployment = model.deployment_plan(plan, speedup=4)
    assert {n for cell in deployment.cells for n in cell.replicas} <= set(app.named_unit_tasks())
    assert set(deployment.profiles) == {DEPLOYMENT_PREFIX + o.name for o in model.options}


def test_qwen25_vl_plan_is_at_least_each_baseline():
    workload = controlled(1.0, (1920, 1080), 1.0, 1000, 300, count=200, seed=0)
    spec = QWEN25_VL.planner_spec(workload)
    best = plan_for_budget(spec, 16, max_exponent=4).throughput
    baselines = {
        label: plan_for_budget(QWEN25_VL.restricted(spec, options), 16, max_exponent=4).throughput
        for label, options in MLLM_BASELINES.items()
    }
    assert all(0 < rate <= best + 1e-9 for rate in baselines.values())
