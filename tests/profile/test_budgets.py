"""Stage-level batching budgets (TriInfer Algorithm 1): the binary search against an exhaustive one,
the latency limit per role, budgets measured through an injected call on a clock the calls advance
(no timing), and budgets set on an app's deployments before they start."""

from __future__ import annotations

import asyncio
import random

import pytest

from prismserve.app import load_app_source
from prismserve.bench.workloads import workloads_dir
from prismserve.errors import InvalidRequestError
from prismserve.executors.vllm_llm import engine_settings
from prismserve.profile.budgets import (
    Budget,
    Budgets,
    apply_budgets,
    budgets_document,
    latency_limit,
    load_budgets,
    measure_budgets,
    role_of,
    search_budget,
)
from prismserve.task.components import LLMInput, MediaItem
from prismserve.tasklib.units import (
    EncoderTask,
    LLMTask,
    VLLMDecodeTask,
    VLLMPrefillTask,
    VLLMTask,
)

APP = """
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import MLLMTask, TextOutput

vl = MLLMTask(model={model!r}, engine="vllm", prefill_decode={split}, vllm={{"dtype": "float32"}})

class Config(AppConfig):
    tasks = {{"vl": vl}}
    input_modalities = frozenset({{"text", "image"}})
    slos = {{"default": {{"ttft_s": 0.4, "tbt_s": 0.05}}, "image+text": {{"ttft_s": 0.8}}}}

async def serve(request: ChatRequest) -> TextOutput:
    return await vl(request)
"""


@pytest.fixture(scope="module")
def tiny_vl() -> str:
    from prismserve.models import tiny

    return str(tiny.build("qwen2.5-vl"))


@pytest.fixture(scope="module")
def cars_jpg() -> bytes:
    return (workloads_dir() / "media" / "cars.jpg").read_bytes()


def largest_within(latency, limit: float, high: int, step: int) -> int | None:
    """The exhaustive answer: the largest multiple of `step` up to `high` within `limit`."""
    fits = [n for n in range(step, high + 1, step) if latency(n) <= limit]
    return max(fits) if fits else None


def test_the_binary_search_finds_the_largest_batch_an_exhaustive_search_finds():
    rng = random.Random(7)
    for _ in range(300):
        base, slope = rng.uniform(0, 0.05), rng.uniform(1e-5, 1e-2)
        jumps = sorted(rng.sample(range(1, 5000), 5))  # monotone with steps, as padded kernels are

        def latency(n, base=base, slope=slope, jumps=jumps):
            return base + slope * n + 0.01 * sum(n >= j for j in jumps)

        high, step, limit = rng.randrange(1, 5000), rng.choice([1, 8, 32]), rng.uniform(0.01, 5)
        if high < step:
            continue

        async def measure(n, latency=latency):
            return latency(n)

        value, measured, within = asyncio.run(search_budget(measure, limit, high, step))
        expected = largest_within(latency, limit, high, step)
        if expected is None:
            assert (value, within) == (step, False) and measured == latency(step)
        else:
            assert (value, within) == (expected, True) and measured == latency(expected)


def test_a_search_measures_each_batch_size_at_most_once_and_logarithmically_often():
    seen: list[int] = []

    async def measure(n):
        seen.append(n)
        return n * 1e-3

    value, _, _ = asyncio.run(search_budget(measure, 1.0, 4096, 32))
    assert value == 992 and len(seen) == len(set(seen)) and len(seen) <= 9


def test_encode_and_prefill_get_alpha_ttft_and_decoding_roles_the_tbt():
    assert [latency_limit(r, 0.4, 0.05) for r in ("E", "EP", "P")] == [0.2, 0.2, 0.2]
    assert [latency_limit(r, 0.4, 0.05) for r in ("D", "PD", "ED", "EPD")] == [0.05] * 4
    assert latency_limit("P", None, 0.05) is None and latency_limit("D", 0.4, None) is None
    with pytest.raises(ValueError, match="unknown role"):
        latency_limit("X", 0.4, 0.05)


def test_each_unit_task_plays_its_triinfer_role(tiny_vl, tmp_path):
    handoff = {"handoff_dir": str(tmp_path)}
    assert role_of(EncoderTask(model=tiny_vl, modality="image")) == "E"
    assert role_of(VLLMPrefillTask(model=tiny_vl, **handoff)) == "P"
    assert role_of(VLLMPrefillTask(model=tiny_vl, with_encoders=True, **handoff)) == "EP"
    assert role_of(VLLMDecodeTask(model=tiny_vl, **handoff)) == "D"
    assert role_of(VLLMTask(model=tiny_vl)) == "PD"
    assert role_of(VLLMTask(model=tiny_vl, with_encoders=True)) == "EPD"
    assert role_of(LLMTask(model=tiny_vl)) is None  # transformers' engine: no budget to set


class Clock:
    """Time that only the fake calls advance: what a batch costs, by a cost model."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_invoke(clock: Clock, tokenizer):
    """A call that costs 30 ms per image and 10 ms + 20 µs per prompt token (counted by the
    model's tokenizer with its chat template), on `clock`."""

    async def invoke(task, value):
        if isinstance(value, MediaItem):
            clock.now += 0.03
            return None
        assert isinstance(value, LLMInput) and value.max_tokens in (1, 2)
        ids = tokenizer.apply_chat_template(value.conversation, tokenize=True, add_generation_prompt=True)
        clock.now += 0.01 + 2e-5 * len(ids["input_ids"])
        return None

    return invoke


@pytest.mark.parametrize("split", [False, True])
def test_budgets_are_measured_for_every_role_against_its_limit(tiny_vl, cars_jpg, split):
    from transformers import AutoTokenizer

    app = load_app_source(APP.format(model=tiny_vl, split=split), "vl")
    clock = Clock()
    invoke = fake_invoke(clock, AutoTokenizer.from_pretrained(tiny_vl))
    budgets = asyncio.run(measure_budgets(invoke, app, cars_jpg, repeats=3, clock=clock))
    assert (budgets.ttft_s, budgets.tbt_s) == (0.4, 0.05)  # the strictest of the app's SLOs
    image = budgets.deployments["vl.encoders.image"]
    # 30 ms an image within α·TTFT = 0.2 s: 6 images (the batcher's limit is 8).
    assert (image.role, image.kind, image.value, image.limit_s, image.within_limit) == (
        "E",
        "images",
        6,
        0.2,
        True,
    )
    # 10 ms + 20 µs a token within the TBT (50 ms): 2000 tokens, 1984 in whole blocks of 32.
    decoding = budgets.deployments["vl.decode" if split else "vl.llm"]
    assert (decoding.role, decoding.value, decoding.limit_s) == ("D" if split else "PD", 1984, 0.05)
    assert decoding.latency_s <= 0.05
    if split:  # within 0.2 s: 9500 tokens, more than one step of the engine as profiled (2048)
        prefill = budgets.deployments["vl.prefill"]
        assert (prefill.role, prefill.value, prefill.limit_s) == ("P", 2048, 0.2)


def test_an_slo_the_smallest_batch_misses_gives_the_smallest_batch_flagged(tiny_vl, cars_jpg):
    from transformers import AutoTokenizer

    source = APP.format(model=tiny_vl, split=False).replace('"tbt_s": 0.05', '"tbt_s": 0.001')
    app = load_app_source(source, "vl")
    clock = Clock()
    invoke = fake_invoke(clock, AutoTokenizer.from_pretrained(tiny_vl))
    budget = asyncio.run(measure_budgets(invoke, app, cars_jpg, repeats=1, clock=clock)).deployments["vl.llm"]
    assert (budget.value, budget.within_limit) == (32, False) and budget.latency_s > 0.001


def test_budgets_set_the_deployments_settings_before_they_start(tiny_vl, tmp_path):
    app = load_app_source(APP.format(model=tiny_vl, split=True), "vl")
    before = {p: t.deployment_key() for p, t in app.named_unit_tasks().items()}
    budgets = Budgets(
        ttft_s=0.4,
        tbt_s=0.05,
        deployments={
            "vl.encoders.image": Budget(
                role="E", kind="images", value=6, limit_s=0.2, latency_s=0.18, within_limit=True
            ),
            "vl.decode": Budget(
                role="D", kind="tokens", value=96, limit_s=0.05, latency_s=0.04, within_limit=True
            ),
            # Below the context (4096): long prompts are prefilled in chunks, each handed over whole.
            "vl.prefill": Budget(
                role="P", kind="tokens", value=2048, limit_s=0.2, latency_s=0.1, within_limit=True
            ),
        },
    )
    path = tmp_path / "vl.budgets.yaml"
    path.write_text(budgets_document(budgets, {"profile of": "vl"}))
    apply_budgets(app, load_budgets(path))
    tasks = app.named_unit_tasks()
    assert tasks["vl.encoders.image"].max_batch == 6 and tasks["vl.decode"].token_budget == 96
    assert tasks["vl.prefill"].token_budget == 2048
    # The app's serve() calls the composite the module holds: it has the budgeted tasks.
    assert app.module.vl.decode is tasks["vl.decode"] and app.module.vl.encoders["image"].max_batch == 6
    after = {p: t.deployment_key() for p, t in tasks.items()}
    assert (
        after["vl.prefill"] != before["vl.prefill"]
        and after["vl.decode"] != before["vl.decode"]
        and after["vl.encoders.image"] != before["vl.encoders.image"]
    )
    args = engine_settings(tasks["vl.decode"], cuda=False)
    assert (args["max_num_batched_tokens"], args["enable_chunked_prefill"], args["max_num_seqs"]) == (
        96,
        True,
        96,
    )
    assert engine_settings(tasks["vl.prefill"], cuda=False)["max_num_batched_tokens"] == 2048


def test_budgets_of_another_app_or_no_budgets_file_are_refused_with_a_fix(tiny_vl, tmp_path):
    app = load_app_source(APP.format(model=tiny_vl, split=False), "vl")
    elsewhere = Budgets(
        deployments={
            "vl.decode": Budget(
                role="D", kind="tokens", value=96, limit_s=0.05, latency_s=0.04, within_limit=True
            )
        }
    )
    with pytest.raises(InvalidRequestError, match="profile the app again"):
        apply_budgets(app, elsewhere)
    spec = tmp_path / "spec.yaml"
    spec.write_text("components: [a]\n")
    with pytest.raises(InvalidRequestError, match="budgets.yaml"):
        load_budgets(spec)


def test_serve_refuses_budgets_of_another_app_before_anything_starts(tiny_vl, tmp_path):
    from prismserve.runtime.pool import InProcessPool
    from prismserve.runtime.ray_runtime import RayRuntime
    from prismserve.serve.launch import ServeOptions, StartupError, prepare_server

    app_file = tmp_path / "vl.py"
    app_file.write_text(APP.format(model=tiny_vl, split=False))
    llm = Budget(role="PD", kind="tokens", value=96, limit_s=0.05, latency_s=0.04, within_limit=True)
    good, other = tmp_path / "good.budgets.yaml", tmp_path / "other.budgets.yaml"
    good.write_text(budgets_document(Budgets(deployments={"vl.llm": llm}), {}))
    other.write_text(budgets_document(Budgets(deployments={"vl.decode": llm}), {}))
    runtime = RayRuntime(values={}, pool=InProcessPool({"a": 1}))  # never started
    server = prepare_server(ServeOptions(str(app_file), port=0, budgets_path=str(good)), runtime=runtime)
    server.listener.close()
    assert server.budgets is not None and server.budgets.deployments["vl.llm"].value == 96
    with pytest.raises(StartupError, match=r"^--budgets: .*\['vl.decode'\].*profile the app again"):
        prepare_server(ServeOptions(str(app_file), port=0, budgets_path=str(other)), runtime=runtime)
    with pytest.raises(StartupError, match=r"^--budgets: cannot read budgets"):
        prepare_server(
            ServeOptions(str(app_file), port=0, budgets_path=str(tmp_path / "none.yaml")), runtime=runtime
        )


def test_profile_prints_the_budgets_and_writes_them_beside_its_out_file(tmp_path, capsys):
    from prismserve.serve.profile_command import _report_budgets

    profile, out = tmp_path / "vl-abc.yaml", tmp_path / "spec.yaml"
    llm = Budget(role="PD", kind="tokens", value=96, limit_s=0.05, latency_s=0.04, within_limit=True)
    _report_budgets(profile, out)
    assert "no batching budgets" in capsys.readouterr().err
    (tmp_path / "vl-abc.budgets.yaml").write_text(budgets_document(Budgets(deployments={"vl.llm": llm}), {}))
    _report_budgets(profile, out)
    assert f"serve --budgets {tmp_path / 'spec.budgets.yaml'}" in capsys.readouterr().err
    assert load_budgets(tmp_path / "spec.budgets.yaml").deployments["vl.llm"].value == 96
