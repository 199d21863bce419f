"""Emulated models: valid paths, planner profiles that match the sim, plans the app can deploy, routing."""

from __future__ import annotations

import asyncio
import io

import pytest
from PIL import Image

from prismserve.app import load_app_source
from prismserve.bench.workloads import RequestSpec, controlled
from prismserve.emulate import DEPLOYMENT_PREFIX, INTERNVL3, QWEN25_OMNI
from prismserve.emulate.app import app_source
from prismserve.emulate.catalog import INTERNVL3_BASELINES
from prismserve.emulate.costs import qwen_image_tokens
from prismserve.emulate.tasks import EmulatedTask, StageOutput, request_spec
from prismserve.planner import plan_for_budget
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import use_dispatcher
from prismserve.task.context import RequestContext, use_request
from prismserve.tasklib.media_tokens import internvl_tiles


def jpeg(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_paths_run_each_needed_component_once_in_order():
    paths = QWEN25_OMNI.paths(("I", "L"))
    assert {"I->L", "I->IVAL", "IVAL", "Monolith", "I->Monolith"} <= set(paths)
    assert paths["I->IVAL"] == [("I", ("I",)), ("IVAL", ("L",))]
    assert "L->I" not in paths and "G" not in paths
    # Only the allowed options: the E/P/D baseline has exactly one path for image requests.
    assert list(INTERNVL3.paths(("E", "P", "D"), allowed=["E", "P", "D"])) == ["E->P->D"]


def test_tile_and_token_counts_follow_the_models():
    assert (
        internvl_tiles(1920, 1080) == 9 and internvl_tiles(1680, 1050) == 7 and internvl_tiles(448, 448) == 1
    )
    assert qwen_image_tokens(280, 56) == 20


def test_planner_profiles_are_what_a_sim_replica_sustains():
    # Identical requests: a replica at full batch serves speed / work of its components per second.
    specs = [RequestSpec(0.0, 1000, 300, images=((1920, 1080),))] * 10
    spec = INTERNVL3.planner_spec(specs)
    work = INTERNVL3.costs.work(specs[0])
    throughput = {o.name: o.throughput for o in spec.options}
    assert throughput["E"] == pytest.approx(1.13)  # 000 Table 1 at the Standard workload
    assert throughput["PD"] == pytest.approx(1.8 / (work["P"] + work["D"]))
    assert 1 / throughput["PD"] * 1.8 == pytest.approx(1 / 0.28)  # the LLM's Table 1 time per request
    epd = INTERNVL3.option("EPD")
    assert throughput["EPD"] == pytest.approx(1.8 / (work["E"] + work["P"] + work["D"] * epd.factors["D"]))
    assert [t.name for t in spec.request_types] == ["image+text"]


def test_plans_deploy_on_the_apps_unit_tasks_and_baselines_use_only_their_options():
    workload = controlled(1.0, (1920, 1080), 1.0, 100, 100, count=500, seed=0)
    spec = INTERNVL3.planner_spec(workload)
    app = load_app_source(app_source(INTERNVL3.name), INTERNVL3.name)
    assert app.context_length == 32768  # what the gateway holds max_tokens to (context_length_exceeded)
    names = set(app.named_unit_tasks())
    for options in INTERNVL3_BASELINES.values():
        plan = plan_for_budget(INTERNVL3.restricted(spec, options), 16, max_exponent=4)
        used = {n for cell in plan.cells for n, r in cell.replicas.items() if r}
        assert used <= set(options)
        deployment = INTERNVL3.deployment_plan(plan, speedup=4)
        assert {n for cell in deployment.cells for n in cell.replicas} <= names
        assert set(deployment.profiles) == {DEPLOYMENT_PREFIX + o.name for o in INTERNVL3.options}
        assert deployment.throughput == pytest.approx(plan.throughput * 4)
    best = plan_for_budget(spec, 16, max_exponent=4)
    monolith = plan_for_budget(INTERNVL3.restricted(spec, ["EPD"]), 16, max_exponent=4)
    assert best.throughput >= monolith.throughput > 0


def test_requests_follow_the_routed_path_with_the_work_of_each_role():
    task = EmulatedTask(spec=QWEN25_OMNI)
    calls: list[tuple[str, float]] = []

    async def sim(stage, stage_input):
        calls.append((stage.option, stage_input.sim_work))
        return StageOutput(payload=[0.0])

    request = ChatRequest.of(
        "what is this", images=[jpeg((684 // 18 * 28, 18 * 28))], audio_out=True, max_tokens=129
    )
    routing = {request.request_type: {"I->IVAL->G": 1.0}}

    async def run():
        with use_dispatcher(LocalDispatcher({"sim": sim})), use_request(RequestContext(routing=routing)):
            return await task(request)

    asyncio.run(run())
    assert [name for name, _ in calls] == ["I", "IVAL", "G"]
    work = QWEN25_OMNI.costs.work(request_spec(request))
    assert calls[1][1] == pytest.approx(work["L"]) and work["L"] == pytest.approx(1 / 1.09)
    assert calls[2][1] == pytest.approx(1 / 0.28)  # the audio generator at 129 output tokens


def test_request_spec_reads_sizes_from_the_request():
    request = ChatRequest.of(
        "a b c", images=[jpeg((64, 32))], audios=[b"RIFF"], videos=[b"clip"], max_tokens=9
    )
    spec = request_spec(request)
    assert spec.images == ((64, 32),) and spec.audios == 1 and spec.videos == 1 and spec.output_tokens == 9
    assert spec.text_tokens == 3 and spec.request_type == request.request_type == "audio+image+text+video"


def test_the_planned_split_is_realised_evenly_and_later_hops_are_served_first():
    """Request-static routing with i.i.d. draws strays by √(n·p·(1−p)) from the plan (±9 of 400 at
    p = 0.3), which a plan with every option saturated loses: the split is smooth weighted
    round-robin, within one request of the plan after every request, and replay keeps the record."""
    task = EmulatedTask(spec=INTERNVL3)
    request = ChatRequest.of("describe", images=[jpeg((1920, 1080))], max_tokens=100)
    routing = {request.request_type: {"E->PD": 0.61, "EPD": 0.39}}  # weights no other test uses
    names = sorted(INTERNVL3.paths(("E", "P", "D")))
    taken = {"E->PD": 0, "EPD": 0}
    with use_request(RequestContext(routing=routing)):
        for n in range(1, 201):
            graph = task.record(request)
            name = names[graph.choices[0]]
            taken[name] += 1
            assert abs(taken["E->PD"] - 0.61 * n) < 1 and abs(taken["EPD"] - 0.39 * n) < 1, (n, taken)
            # Each hop asks its replica to serve it ahead of requests at an earlier hop.
            assert [node.input.sim_priority for node in graph.nodes] == list(range(len(graph.nodes)))
            if n == 100:  # replay follows the recorded path and does not move the round-robin on
                outputs = [StageOutput(payload=[0.0])] * len(graph.nodes)
                for _ in range(3):
                    task.replay(request, graph, outputs)


def test_llava15_has_triinfers_seven_roles_on_one_gpu_and_its_work_follows_the_replay_costs():
    from prismserve.emulate import LLAVA15
    from prismserve.planner.stage_batching import stage_budgets

    assert [o.name for o in LLAVA15.options] == ["E", "P", "D", "EP", "ED", "PD", "EPD"]
    assert all(o.gpus == 1 for o in LLAVA15.options)
    assert LLAVA15.option("ED").components == ("E", "D")
    costs = LLAVA15.costs.stage_costs()
    spec = RequestSpec(0.0, 40, 21, images=((640, 480),))
    work = LLAVA15.costs.work(spec)
    prefill = stage_budgets("P", costs).tokens
    assert work["P"] == pytest.approx(costs.llm_s(prefill, 0) / prefill * (40 + 576))
    assert work["E"] == pytest.approx(costs.encode_s(6) / 6)
    assert LLAVA15.costs.needs(RequestSpec(0.0, 40, 21)) == ("P", "D")
    # The MILP plans it (ED lies on no planner path, so it gets no replica).
    plan = plan_for_budget(LLAVA15.planner_spec([spec] * 10), 8, max_exponent=3)
    assert plan.gpus == 8 and all("ED" not in cell.replicas for cell in plan.cells)
    # It is servable: its app loads, with one unit task per option.
    app = load_app_source(app_source(LLAVA15.name), LLAVA15.name)
    assert app.name == LLAVA15.name


def test_an_emulated_answer_reports_its_token_count():
    # The gateway's usage and a recorded trace (`serve --record-trace`) read it.
    from prismserve.emulate.tasks import completion

    answer = completion(ChatRequest.of("hello", max_tokens=7))
    assert answer.tokens == 7 and len(answer.text.split()) == 7


def test_qwen_image_keeps_table_1s_rates_and_the_planner_keeps_its_monolith_on_16_gpus():
    from prismserve.emulate.catalog import QWEN_IMAGE, QWEN_IMAGE_BASELINES

    for tokens, monolith_rps in ((1000, 16 / (1 / 15.67 + 1 / 0.20)), (2000, None)):
        requests = controlled(1.0, (512, 512), 0.0, tokens, 1, count=50, seed=0)
        spec = QWEN_IMAGE.planner_spec(requests)
        rates = {option.name: option.throughput for option in spec.options}
        if tokens == 1000:  # Table 1's reference request: its rates exactly
            assert rates["T"] == pytest.approx(15.67) and rates["G"] == pytest.approx(0.20)
        else:  # longer prompts cost the encoder and the DiT more
            assert rates["T"] == pytest.approx(15.67 / 2) and rates["G"] < 0.20
        plan = plan_for_budget(spec, 16, max_exponent=4)
        # 000 §7.3.3: the monolith on every GPU; the split gives a GPU to an encoder that would idle.
        assert {name for cell in plan.cells for name, n in cell.replicas.items() if n} == {"TG"}
        assert sum(cell.count * cell.replicas["TG"] for cell in plan.cells) == 16
        if monolith_rps is not None:
            assert plan.throughput == pytest.approx(monolith_rps)
        split = plan_for_budget(QWEN_IMAGE.restricted(spec, QWEN_IMAGE_BASELINES["T/G"]), 16, max_exponent=4)
        assert split.throughput < plan.throughput
