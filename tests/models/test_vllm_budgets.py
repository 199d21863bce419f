"""TriInfer's token budget (Algorithm 1) measured by the profiler on a real vLLM engine over Ray, then set
on the engine of the deployment serve starts: its `max_num_batched_tokens`, chunked prefill on."""

from __future__ import annotations

import asyncio
import json

from prismserve.profile import cached_profile
from prismserve.profile.budgets import apply_budgets, budgets_path, load_budgets
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.ray_runtime import RayRuntime
from prismserve.tasklib import reply_text

APP = """
from prismserve.app import AppConfig
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import MLLMTask, TextOutput

# A context of 1024 tokens: the budget searched stays below vLLM's default step (2048), so the
# served engine's step can only be the budget's.
vl = MLLMTask(model={model!r}, engine="vllm", vllm={{"dtype": "float32", "max_model_len": 1024}})

class Config(AppConfig):
    tasks = {{"vl": vl}}
    input_modalities = frozenset({{"text", "image"}})
    slos = {{"default": {{"ttft_s": 30.0, "tbt_s": 0.5}}}}

async def serve(request: ChatRequest) -> TextOutput:
    return await vl(request)
"""


def test_a_token_budget_profiled_on_vllm_is_the_served_engines_step(
    ray_cluster, vllm_probes, tiny_vl, tmp_path, monkeypatch
):
    monkeypatch.setenv("PRISMSERVE_PROFILE_CACHE", str(tmp_path / "profiles"))
    workload = tmp_path / "text.jsonl"
    workload.write_text(json.dumps({"text_tokens": 8, "output_tokens": 4}) + "\n")
    source = APP.format(model=tiny_vl)

    async def profiled():
        runtime = RayRuntime()
        await runtime.start()
        try:
            app = await runtime.register_app(source, "vl")
            _, path, fresh = await cached_profile(runtime, app, source, str(workload), 1, batch=1, rounds=1)
            return path, fresh
        finally:
            await runtime.close()

    async def served(budgets):
        runtime = RayRuntime()
        await runtime.start()
        try:  # as `prismserve serve --budgets FILE` registers the app
            app = await runtime.register_app(
                source, "vl", prepare=lambda loaded: apply_budgets(loaded, budgets)
            )
            async with runtime.request(app.name, "text"):
                answer = await reply_text((await app.serve(ChatRequest.of("hello", max_tokens=4))).text)
            llm = app.named_unit_tasks()["vl.llm"]
            return runtime.managers[llm.deployment_key()].task, answer
        finally:
            await runtime.close()

    path, fresh = asyncio.run(profiled())
    assert fresh
    budget = load_budgets(budgets_path(path)).deployments["vl.llm"]
    print(f"measured token budget: {budget}")  # a figure, not checked: the machine is shared and noisy
    assert (budget.role, budget.kind, budget.limit_s) == ("PD", "tokens", 0.5)
    assert budget.value % 32 == 0 and 32 <= budget.value <= 1016 and budget.latency_s > 0
    deployed, answer = asyncio.run(served(load_budgets(budgets_path(path))))
    assert deployed.token_budget == budget.value and isinstance(answer, str)  # served by that engine
    engine = vllm_probes.run("vllm_engine_probe.py", {"task": deployed})
    assert engine["max_num_batched_tokens"] == budget.value and engine["enable_chunked_prefill"]
    assert engine["max_num_seqs"] == min(budget.value, 128) and isinstance(engine["text"], str)
