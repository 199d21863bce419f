"""Valid paths (000 Appendix B as read in papers/NOTES.md) and the route graphs the MILP uses."""

from __future__ import annotations

import itertools
import random

import pytest
from planner_instances import random_spec

from prismserve.planner import SpecError, build_model, parse_spec, route_graph, valid_paths
from prismserve.planner.paths import roles_of


def spec_elg(options, paths=None):
    types = [
        {"name": "text", "components": ["L"], "share": 0.5},
        {"name": "all", "components": ["E", "L", "G"], "share": 0.5},
    ]
    if paths is not None:
        types[1]["paths"] = paths
    return parse_spec(
        {
            "components": ["E", "L", "G"],
            "options": [{"name": n, "components": list(n), "gpus": 1, "throughput": 1.0} for n in options],
            "request_types": types,
        }
    )


def names(spec, type_name):
    (request_type,) = [t for t in spec.request_types if t.name == type_name]
    return sorted(p.name for p in valid_paths(spec, request_type))


def test_a_text_only_request_runs_on_the_colocated_option_with_role_l():
    spec = spec_elg(["E", "L", "G", "EL"])
    assert names(spec, "text") == ["EL", "L"]
    (text,) = [t for t in spec.request_types if t.name == "text"]
    assert roles_of(spec, text, ["EL"]) == (frozenset({"L"}),)
    # Restricted to the monolith, text-only requests are still served (role {L}).
    only_monolith = parse_spec(
        {
            "components": ["E", "L"],
            "options": [
                {"name": "E", "components": ["E"], "gpus": 1, "throughput": 1.0},
                {"name": "L", "components": ["L"], "gpus": 1, "throughput": 1.0},
                {"name": "EL", "components": ["E", "L"], "gpus": 1, "throughput": 1.0},
            ],
            "request_types": [{"name": "text", "components": ["L"], "share": 1.0, "paths": [["EL"]]}],
        }
    )
    assert names(only_monolith, "text") == ["EL"]


def test_e_l_g_paths_through_colocated_options():
    spec = spec_elg(["E", "L", "G", "EL", "LG", "ELG"])
    assert names(spec, "all") == sorted(
        [
            "E->L->G",
            "E->LG",
            "EL->G",
            "EL->LG",
            "ELG",
            "E->ELG",
            "E->L->LG",
            "E->L->ELG",
            "EL->ELG",
            "E->EL->G",
            "E->EL->LG",
            "E->EL->ELG",
        ]
    )
    # The five paths NOTES.md names are among them.
    assert {"E->L->G", "E->LG", "EL->G", "EL->LG", "ELG"} <= set(names(spec, "all"))


def test_eg_cannot_start_an_e_l_g_request():
    spec = spec_elg(["E", "L", "G", "EG"])
    paths = names(spec, "all")
    assert not any(p.startswith("EG") for p in paths)
    (request_type,) = [t for t in spec.request_types if t.name == "all"]
    assert roles_of(spec, request_type, ["EG", "L"]) is None  # role {E, G} would run G before L
    # Once E and L have run elsewhere, EG's role is {G}: that path is valid.
    assert "E->L->EG" in paths and "E->L->G" in paths
    with pytest.raises(
        SpecError, match=r"path EG->L does not run each of \['E', 'L', 'G'\] exactly once in model order"
    ):
        build_model(spec_elg(["E", "L", "G", "EG"], paths=[["EG", "L"]]))


def test_explicit_paths_are_exactly_the_walks_of_their_route_graph():
    spec = spec_elg(["E", "L", "G", "EL", "LG"], paths=[["E", "LG"], ["EL", "G"], ["E", "L", "G"]])
    assert names(spec, "all") == ["E->L->G", "E->LG", "EL->G"]
    with pytest.raises(SpecError, match="path names unknown options \\['X'\\]"):
        spec_elg(["E", "L", "G"], paths=[["E", "X"]])


def brute_force_paths(spec, request_type):
    """Every option sequence (no repeats, up to the type's length) that `roles_of` accepts."""
    found = set()
    options = [e.name for e in spec.options]
    for length in range(1, len(request_type.components) + 1):
        for sequence in itertools.permutations(options, length):
            if roles_of(spec, request_type, list(sequence)) is not None:
                found.add("->".join(sequence))
    return found


def test_route_graph_walks_are_exactly_the_valid_paths_on_random_specs():
    rng = random.Random(3)
    for _ in range(60):
        spec = random_spec(rng)
        for request_type in spec.request_types:
            graph = route_graph(spec, request_type)
            walks = {"->".join(h.option for h in walk) for walk in graph.walks()}
            assert walks == brute_force_paths(spec, request_type)
            # No dead ends: every hop lies on some walk.
            used = {hop for walk in graph.walks() for hop in walk}
            assert used == set(graph.hops)


def test_a_request_type_no_option_can_serve_is_rejected_by_name():
    spec = parse_spec(
        {
            "components": ["E", "L", "G"],
            "options": [
                {"name": "E", "components": ["E"], "gpus": 1, "throughput": 1.0},
                {"name": "L", "components": ["L"], "gpus": 1, "throughput": 1.0},
            ],
            "request_types": [{"name": "speech", "components": ["E", "L", "G"], "share": 1.0}],
        }
    )
    with pytest.raises(SpecError, match="request type 'speech' has no valid path"):
        build_model(spec)


def spec_epd(separable: bool, **throughputs: float):
    """Encode, prefill, decode: options named by their components, ED separable or not."""
    return parse_spec(
        {
            "components": ["E", "P", "D"],
            "options": [
                {
                    "name": n,
                    "components": list(n),
                    "gpus": 1,
                    "throughput": t,
                    "separable": n == "ED" and separable,
                }
                for n, t in throughputs.items()
            ],
            "request_types": [{"name": "image", "components": ["E", "P", "D"], "share": 1.0}],
        }
    )


def test_a_separable_option_is_visited_once_per_block_it_holds():
    """TriInfer's ED: encode, prefill elsewhere, then decode on ED again; under 000's rule it cannot
    start the request (its role {E, D} would decode before prefill)."""
    spec = spec_epd(True, E=1.0, P=1.0, D=1.0, ED=1.0)
    assert {"ED->P->ED", "ED->P->D", "E->P->ED", "E->P->D"} == set(names(spec, "image"))
    (image,) = spec.request_types
    assert roles_of(spec, image, ["ED", "P", "ED"]) == (frozenset("E"), frozenset("P"), frozenset("D"))
    assert roles_of(spec, image, ["ED", "P"]) is None  # decode never ran
    # 000's rule: ED only decodes, once E and P ran elsewhere.
    assert names(spec_epd(False, E=1.0, P=1.0, D=1.0, ED=1.0), "image") == ["E->P->D", "E->P->ED"]


def test_the_milp_plans_ed_and_p_when_they_serve_best():
    from prismserve.planner import plan_for_budget

    # ED serves encode and decode at 2 req/s, P prefill at 2 req/s; the solo options are slow.
    spec = spec_epd(True, E=0.5, P=2.0, D=0.5, ED=2.0)
    plan = plan_for_budget(spec, 2)
    assert plan.replicas() == {"ED": 1, "P": 1}
    assert plan.routing["image"] == {"ED->P->ED": 1.0}
    assert plan.throughput == pytest.approx(2.0, rel=1e-6)
