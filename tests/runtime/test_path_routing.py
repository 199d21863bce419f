"""Path-level dynamic routing (`serve --routing path`): a request's whole path is chosen at its entry
among the plan's paths by the load the task managers count, then every hop follows it. In-process
replicas with declared GPUs, no Ray."""

from __future__ import annotations

from collections import Counter

import pytest
from runtime_apps import SOLO
from test_layout import PLAN, calls_by_shape
from test_resources import run

from prismserve.planner import Plan
from prismserve.protocol.chat import ChatRequest
from prismserve.task.routing import least_loaded_path


def loads(table):
    """A `PathLoad` reading (calls in flight, running replicas) from a dict."""
    return lambda key: table.get(key, (0, 0))


def test_the_path_whose_busiest_hop_is_least_loaded_is_chosen():
    # E->L and the monolith M share nothing; E->M shares the monolith.
    hops = [[("E", 1), ("L", 1)], [("M", 1)], [("E", 1), ("M", 1)]]
    weights = [0.5, 0.3, 0.2]
    # Per replica with the call added: E 4, L 2, M 10.25 -> E->L's busiest hop (4) is the lightest.
    busy_monolith = loads({"E": (3, 1), "L": (3, 2), "M": (40, 4)})
    assert {least_loaded_path("a", weights, hops, busy_monolith) for _ in range(10)} == {0}
    # E 4, L 15.5, M 1.25: the monolith alone (E->M's busiest hop is its encoder).
    busy_llm = loads({"E": (3, 1), "L": (30, 2), "M": (4, 4)})
    assert {least_loaded_path("b", weights, hops, busy_llm) for _ in range(10)} == {1}


def test_a_hops_load_is_work_not_calls():
    # Four short calls queued on F weigh less than one long call on S.
    hops = [[("fast", 0.1)], [("slow", 10.0)]]
    table = loads({"fast": (4, 1), "slow": (1, 1)})
    assert {least_loaded_path("w", [0.5, 0.5], hops, table) for _ in range(5)} == {0}


def test_tied_paths_follow_the_plans_split_and_unplanned_or_unserved_paths_are_never_taken():
    hops = [[("A", 1)], [("B", 1)], [("C", 1)], [("D", 1)]]
    weights = [0.75, 0.25, 0.0, 0.5]
    # A and B equally loaded; C is lighter but the plan does not use it; D has no running replica.
    table = loads({"A": (2, 1), "B": (2, 1), "C": (0, 1), "D": (0, 0)})
    chosen = Counter(least_loaded_path("tie", weights, hops, table) for _ in range(40))
    assert chosen == {0: 30, 1: 10}


def test_hops_must_match_the_paths():
    with pytest.raises(ValueError, match="one per path"):
        least_loaded_path("x", [1.0, 1.0], [[("A", 1)]], loads({}))


def test_requests_avoid_the_loaded_path_and_every_hop_stays_on_the_chosen_one():
    async def scenario(runtime):
        runtime.policy = "path"
        app = await runtime.register_app(SOLO, "mllm")
        await runtime.deploy("mllm", Plan.model_validate(PLAN))
        # Load the colocated option (E+L, on paths E+L and E->E+L): a lease held on each replica of
        # its LLM share, as if calls were queued there.
        colocated = next(
            m for m in runtime.managers.values() if type(m.task).__name__ == "LLMTask" and m.task.gpus == 0.75
        )
        held = [await colocated.lease("static") for _ in colocated.replicas]
        for index in range(12):
            request = ChatRequest.of(f"q{index}", images=[b"a"])
            async with runtime.request("mllm", request.request_type):
                await app.serve(request)
        loaded = calls_by_shape(runtime, "EncoderTask"), calls_by_shape(runtime, "LLMTask")
        for lease in held:
            lease.release()
        # Idle again: the colocated option has 2 replicas to E->L's 1, so it is the least loaded.
        for index in range(4):
            request = ChatRequest.of(f"r{index}", images=[b"a"])
            async with runtime.request("mllm", request.request_type):
                await app.serve(request)
        return loaded, calls_by_shape(runtime, "EncoderTask"), calls_by_shape(runtime, "LLMTask")

    (encoders, llms), after_encoders, after_llms = run(scenario)
    # Every request took E->L whole: its encoder and its LLM calls on the solo replicas, none on the
    # colocated ones (the plan's split would have sent 3 of 12 through E+L and 3 through E->E+L).
    assert encoders == {1.0: 12, 0.25: 0}
    assert llms == {1.0: 12, 0.75: 2}  # the 2 held leases count as calls
    assert after_encoders == {1.0: 12, 0.25: 4}
    assert after_llms == {1.0: 12, 0.75: 6}
