"""The profiler on the toy Omni app (sim replicas in this process, declared GPUs, no Ray): request types
and their deployments found by recording, times measured, the spec planned and served without a Router,
profiles cached."""

from __future__ import annotations

import asyncio

import pytest
from toy import APP_PATH
from toy.executors import VALUES

from prismserve.bench.workloads import RequestSpec, workloads_dir
from prismserve.planner import plan_for_budget
from prismserve.profile import cached_profile, deployable, profile
from prismserve.profile.measure import serve_one
from prismserve.profile.requests import chat_request, deployments_of, model_order, profile_requests
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.ray_runtime import RayRuntime

SOURCE = APP_PATH.read_text()
ENC, AUD, LLM, TALK, VOC = (
    "omni.thinker.encoders.image",
    "omni.thinker.encoders.audio",
    "omni.thinker.llm",
    "omni.talker",
    "omni.vocoder",
)
WORKLOAD = [
    RequestSpec(0.0, 8, 4),
    RequestSpec(0.0, 8, 4, images=((64, 48),)),
    RequestSpec(0.0, 8, 4, images=((64, 48),)),
    RequestSpec(0.0, 8, 4, audios=1, audio_out=True),
]


@pytest.fixture
def workloads():
    """The shared workload media (what `prismserve bench` sends)."""
    return workloads_dir()


def run(scenario):
    async def main():
        runtime = RayRuntime(values=VALUES, pool=InProcessPool({"a": 8}))
        await runtime.start()
        try:
            app = await runtime.register_app(SOURCE, "omni")
            return await asyncio.wait_for(scenario(runtime, app), 120)
        finally:
            await runtime.close()

    return asyncio.run(main())


def test_each_request_types_deployments_are_read_from_the_apps_recorded_graph(workloads):
    async def scenario(runtime, app):
        calls_before = sum(r.calls for m in runtime.managers.values() for r in m.replicas)
        found = {}
        for spec in WORKLOAD:
            request = chat_request(spec, workloads)
            found[request.request_type] = await deployments_of(app, request)
        calls_after = sum(r.calls for m in runtime.managers.values() for r in m.replicas)
        return found, calls_after - calls_before

    found, calls = run(scenario)
    assert found == {
        "text": [LLM],
        "image+text": [ENC, LLM],
        "audio+text->audio": [AUD, LLM, TALK, VOC],
    }
    assert calls == 0  # recording runs nothing


def test_model_order_keeps_every_types_order_and_falls_back_on_disagreement():
    assert model_order([[LLM], [ENC, LLM], [AUD, LLM, TALK, VOC]]) == [ENC, AUD, LLM, TALK, VOC]
    assert model_order([["a", "b"], ["b", "a"]]) == ["a", "b"]


def test_profile_requests_ask_for_their_types_mean_output_and_differ_in_text(workloads):
    """A profile round's requests end together (a continuous batcher's batch stays full, as under
    load) and keep the workload's inputs; a type with fewer requests than a round is repeated, its
    texts apart, so that no prefix cache serves one from another."""
    specs = [
        RequestSpec(0.0, 8, 300, images=((64, 48),)),
        RequestSpec(0.0, 9, 2),
        RequestSpec(0.0, 8, 10, images=((96, 48),)),
        RequestSpec(0.0, 8, 11, images=((64, 64),)),
    ]
    made = profile_requests(specs, workloads, 4)
    assert sorted(made) == ["image+text", "text"]
    images = made["image+text"]
    assert [r.max_tokens for r in images] == [107] * 4  # (300 + 10 + 11) / 3
    assert [r.max_tokens for r in made["text"]] == [2] * 4
    widths = [[len(i.data) for i in r.images] for r in images]
    assert widths[0] == widths[3] != widths[1] != widths[2]  # the type's own images, again from the first
    texts = [r.messages[0].text for r in images + made["text"]]
    assert len(set(texts)) == len(texts)
    assert len({len(t.split()) for t in texts[:4]}) == 1  # the same length: the text starts apart


def test_the_profile_plans_a_deployment_that_serves_every_type_without_a_router(workloads):
    async def scenario(runtime, app):
        spec = await profile(runtime, app, WORKLOAD, batch=2, rounds=1)
        plan = plan_for_budget(spec, 6)
        await runtime.deploy("omni", deployable(plan, spec, app))
        for s in WORKLOAD:
            await serve_one(runtime, app, chat_request(s, workloads))
        placed = {
            runtime.managers[k].task.deployment_key() for c in runtime.resources.cells for k in c.replicas
        }
        return spec, plan, placed

    spec, plan, placed = run(scenario)
    assert spec.components == [ENC, AUD, LLM, TALK, VOC]
    assert {t.name: t.share for t in spec.request_types} == {
        "text": 0.25,
        "image+text": 0.5,
        "audio+text->audio": 0.25,
    }
    llm = spec.option(LLM)
    assert set(llm.role_seconds) == {"text", "image+text", "audio+text->audio"}
    # Its throughput at the mix is the inverse of the mean measured time per request of the mix.
    mean = sum(t.share * llm.role_seconds[t.name][LLM] for t in spec.request_types)
    assert abs(llm.throughput - 1 / mean) < 1e-6 * llm.throughput
    assert plan.gpus == 6 and sum(plan.replicas().values()) == 6
    assert plan.routing["audio+text->audio"] == {f"{AUD}->{LLM}->{TALK}->{VOC}": 1.0}
    assert len(placed) == 5  # every deployment got replicas from the plan


# Replicas of known service time: a call alone takes `latency_s` and none is batched with another,
# so a replica's seconds per request are exactly that, whatever else the request runs on.
KNOWN_S = {ENC: 0.3, LLM: 0.15}


def test_seconds_per_request_are_the_replicas_known_service_times(workloads):
    """The profiler's own oracle is its busy-time arithmetic; here the oracle is the replicas' known
    service time. Image+text runs the encoder then the LLM: an LLM call waits for the encoder's
    output, and that wait is not the LLM's time (a lease taken at dispatch would count it: 0.15 s
    measured as about 0.4 s)."""
    from prismserve.planner import CellPlan, Plan
    from prismserve.profile.measure import seconds_per_request

    async def scenario(runtime, app):
        plan = Plan(
            cells=[CellPlan(gpus=1, replicas={d: 1}) for d in (ENC, AUD, LLM, TALK, VOC)],
            profiles={d: {"latency_s": s, "max_batch": 1} for d, s in KNOWN_S.items()},
        )
        await runtime.deploy("omni", plan)
        request = chat_request(WORKLOAD[1], workloads)
        measured, _ = await seconds_per_request(runtime, app, {request.request_type: [request]}, 4, 2)
        keys = {d: t.deployment_key() for d, t in app.named_unit_tasks().items()}
        return {d: measured["image+text"][keys[d]] for d in KNOWN_S}

    measured = run(scenario)
    for deployment, known in KNOWN_S.items():
        # Within 20 %: a call's own overhead (in-process replicas) on a shared, busy machine.
        assert known * 0.95 <= measured[deployment] <= known * 1.2, (deployment, measured)


def test_a_streaming_stage_is_busy_until_its_stream_ends(workloads):
    """A stage that answers with a stream works until the stream's last item: its lease lasts that
    long, so the profiler counts that time and least-loaded routing sees the load. Its lease used to
    be given back when the call answered with the stream: an LLM streaming 4 tokens of 0.05 s (all
    in flight slowing each other, as one engine's batch) measured 0.0003 s per request instead of 0.2,
    and a replica streaming an answer looked idle. It is given back before the stream ends, so a
    reader that saw the end sees the replica free."""
    from prismserve.planner import CellPlan, Plan
    from prismserve.profile.measure import seconds_per_request

    async def scenario(runtime, app):
        plan = Plan(
            cells=[CellPlan(gpus=1, replicas={d: 1}) for d in (ENC, AUD, LLM, TALK, VOC)],
            profiles={LLM: {"item_s": 0.05, "batch_growth": 1.0}},
        )
        await runtime.deploy("omni", plan)
        request = chat_request(WORKLOAD[0], workloads)  # 4 tokens out
        measured, _ = await seconds_per_request(runtime, app, {request.request_type: [request]}, 4, 2)
        key = app.named_unit_tasks()[LLM].deployment_key()
        (replica,) = runtime.managers[key].replicas
        held = []
        async with runtime.request(app.name, request.request_type):
            answer = await app.serve(request)
            async for _ in answer:
                held.append(replica.in_flight)
        return measured["text"][key], held, replica.in_flight

    seconds, held, after = run(scenario)
    assert 0.2 * 0.95 <= seconds <= 0.2 * 1.3, seconds
    assert held and all(n == 1 for n in held[:-1]) and after == 0, (held, after)


def test_a_profile_is_measured_once_then_read_from_the_cache(workloads, tmp_path, monkeypatch):
    monkeypatch.setenv("PRISMSERVE_PROFILE_CACHE", str(tmp_path))

    async def scenario(runtime, app):
        import prismserve.profile as profiler

        monkeypatch.setattr(profiler, "workload", lambda name, count: WORKLOAD)
        first = await cached_profile(runtime, app, SOURCE, batch=2, rounds=1)
        calls = sum(r.calls for m in runtime.managers.values() for r in m.replicas)
        second = await cached_profile(runtime, app, SOURCE, batch=2, rounds=1)
        unchanged = calls == sum(r.calls for m in runtime.managers.values() for r in m.replicas)
        edited = await cached_profile(runtime, app, SOURCE + "\n# edited\n", batch=2, rounds=1)
        return first, second, unchanged, edited

    first, second, unchanged, edited = run(scenario)
    assert first[2] is True and second[2] is False and unchanged
    assert second[0] == first[0] and second[1] == first[1]
    assert edited[2] is True and edited[1] != first[1]  # another app version: measured again
    assert first[1].read_text().startswith("# profile of: omni\n")


SHARED = """
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from prismserve.task import Task
from toy.executors import VALUES
from toy.tasks import ChatOutput, EncoderTask, LLMInput, LLMTask, MediaInput


class Split(Task[ChatRequest, ChatOutput]):
    def post_init(self):
        self.encoder = EncoderTask(model_id="vl", modality="image", gpus=0.25)
        self.llm = LLMTask(model_id="vl", gpus=0.7)

    def invoke(self, request):
        media = [MediaInput(modality="image", data=p.data) for p in request.images]
        embeddings = [self.encoder.invoke(m).embedding for m in media]
        return ChatOutput(text=self.llm.invoke(LLMInput(prompt=request.prompt, embeddings=embeddings)))


split = Split()


class Config(AppConfig):
    tasks = {"split": split}
    input_modalities = frozenset({"text", "image"})
    sim_values = VALUES


async def serve(request: ChatRequest) -> ChatOutput:
    return await split(request)
"""


def test_deployments_the_app_packs_on_one_gpu_are_a_colocated_option_the_plan_can_use(workloads):
    async def scenario(runtime, _):
        app = await runtime.register_app(SHARED, "shared")
        spec = await profile(runtime, app, WORKLOAD[:3], batch=2, rounds=1)
        plan = plan_for_budget(spec, 1)  # one GPU: only the colocated option serves both types
        await runtime.deploy("shared", deployable(plan, spec, app))
        for s in WORKLOAD[:3]:
            await serve_one(runtime, app, chat_request(s, workloads))
        cells = [
            (c.gpus, sorted(runtime.managers[k].task.gpus for k in c.replicas))
            for c in runtime.resources.cells
            if c.owner == "shared"
        ]
        return spec, plan, cells

    spec, plan, cells = run(scenario)
    both = spec.option("split.encoder+split.llm")
    solo = {o.name: o for o in spec.options}
    # The group's time for a role is its members' measured times added up (they share the GPU).
    assert both.role_seconds["image+text"]["split.encoder+split.llm"] == pytest.approx(
        solo["split.encoder"].role_seconds["image+text"]["split.encoder"]
        + solo["split.llm"].role_seconds["image+text"]["split.llm"]
    )
    assert both.role_seconds["text"] == {"split.llm": solo["split.llm"].role_seconds["text"]["split.llm"]}
    assert plan.replicas() == {"split.encoder+split.llm": 1}
    assert cells == [(1, [0.25, 0.7])]  # the app's own shares, on one GPU


def test_a_workload_that_cannot_be_had_is_one_line_before_anything_starts(tmp_path):
    import subprocess
    import sys

    from toy import APP_PATH

    for command in (
        ["profile", str(APP_PATH), "--workload", "nosuch"],
        ["serve", str(APP_PATH), "--gpus", "2", "--profile-workload", "nosuch"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "prismserve", *command], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2, result.stderr
        assert "unknown workload 'nosuch': give a workload file or one of any2any" in result.stderr
        assert "Traceback" not in result.stderr and "Ray" not in result.stderr


def test_a_workload_file_is_read_back_as_written(tmp_path):
    from prismserve.bench.workloads import read_requests, write_requests
    from prismserve.profile import workload

    write_requests(WORKLOAD, tmp_path / "w.jsonl")
    assert read_requests(tmp_path / "w.jsonl") == WORKLOAD
    assert workload(str(tmp_path / "w.jsonl"), 99) == WORKLOAD
    (tmp_path / "bad.jsonl").write_text('{"text_tokens": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a request"):
        read_requests(tmp_path / "bad.jsonl")


def test_a_workload_file_is_known_by_its_name_and_content_not_its_folder(tmp_path):
    """A temporary copy of the same workload file finds the profile measured on another copy."""
    from prismserve.profile import _workload_identity

    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "workload.jsonl").write_text('{"text_tokens": 8}\n' if folder != "c" else "{}\n")
    a, b, c = (_workload_identity(str(tmp_path / f / "workload.jsonl"), 0) for f in ("a", "b", "c"))
    assert a == b and a != c and str(tmp_path) not in a
