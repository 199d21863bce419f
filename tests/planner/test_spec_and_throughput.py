"""The plan spec's validation and Algorithm 3 (000 Appendix C)."""

from __future__ import annotations

import json

import pytest

from prismserve.planner import SpecError, build_model, load_spec, parse_spec

MLLM = {
    "components": ["E", "L"],
    "options": [
        {"name": "E", "components": ["E"], "gpus": 1, "throughput": 20.0},
        {"name": "L", "components": ["L"], "gpus": 1, "throughput": 6.0},
        {"name": "EL", "components": ["E", "L"], "gpus": 1, "throughput": 4.0},
    ],
    "request_types": [
        {"name": "text", "components": ["L"], "share": 0.3},
        {"name": "image", "components": ["E", "L"], "share": 0.7},
    ],
}


def test_algorithm_3_times_add_and_the_colocation_factor_matches_the_measured_mean():
    model = build_model(parse_spec(MLLM))
    # τ_c = y_s / fraction of requests using c: 70 % of requests use the encoder.
    assert model.tau["E"] == pytest.approx((1 / 20) / 0.7) and model.tau["L"] == pytest.approx(1 / 6)
    # α_EL is fitted so that the mix's mean time on EL is its measured 1/4 s.
    alpha = model.alpha["EL"]
    assert 0.3 * alpha * model.tau["L"] + 0.7 * alpha * (model.tau["E"] + model.tau["L"]) == pytest.approx(
        1 / 4
    )
    paths = [p.name for p in model.paths["image"]]
    el, e_l = paths.index("EL"), paths.index("E->L")
    assert model.throughput("EL", "image", el) == pytest.approx(
        1 / (alpha * (model.tau["E"] + model.tau["L"]))
    )
    assert model.throughput("E", "image", el) == float("inf")  # not on the path: x/w = 0
    assert model.throughput("E", "image", e_l) == pytest.approx(1 / model.tau["E"])
    # A text request on the monolith only runs L there (role {L}).
    assert model.throughput("EL", "text", [p.name for p in model.paths["text"]].index("EL")) == pytest.approx(
        1 / (alpha * model.tau["L"])
    )


def test_measured_role_times_replace_algorithm_3_and_change_the_plan():
    from prismserve.planner import plan_for_budget

    estimated = build_model(parse_spec(MLLM))
    # EL measured much faster for image requests' L-only role (after a separate encoder) than α·τ_L says.
    data = {
        **MLLM,
        "options": [
            *MLLM["options"][:2],
            {**MLLM["options"][2], "role_seconds": {"image": {"L": 0.02}}},
        ],
    }
    measured = build_model(parse_spec(data))
    role = frozenset({"L"})
    assert measured.seconds("EL", role, "image") == 0.02
    assert measured.seconds("EL", role, "text") == pytest.approx(
        estimated.seconds("EL", role, "text")
    )  # not profiled: estimate
    before = plan_for_budget(parse_spec(MLLM), 4, max_exponent=2).routing["image"]
    after = plan_for_budget(parse_spec(data), 4, max_exponent=2).routing["image"]
    assert before.get("E->EL", 0) == 0 and after.get("E->EL", 0) > 0.5


def test_a_component_only_inside_colocated_options_is_rejected_by_name():
    data = {**MLLM, "options": [MLLM["options"][1], MLLM["options"][2]]}
    with pytest.raises(SpecError, match="component 'E' has no option that runs it alone"):
        parse_spec(data)


def test_a_component_no_request_needs_may_sit_only_inside_a_colocated_option():
    """A mix without video plans a model whose monolith holds a video encoder: the encoder's solo
    option profiled nothing (no request reached it), and the monolith still plans."""
    from prismserve.planner import plan_for_budget

    data = {
        "components": ["E", "V", "L"],
        "options": [
            MLLM["options"][0],
            MLLM["options"][1],
            {"name": "EVL", "components": ["E", "V", "L"], "gpus": 1, "throughput": 4.0},
        ],
        "request_types": MLLM["request_types"],
    }
    model = build_model(parse_spec(data))
    assert "V" not in model.tau
    assert model.alpha["EVL"] == pytest.approx(build_model(parse_spec(MLLM)).alpha["EL"])
    plan = plan_for_budget(parse_spec(data), 2, max_exponent=1)
    assert plan.throughput > 0


def test_a_second_singleton_keeps_its_own_speed_and_tau_comes_from_the_smallest():
    data = {
        **MLLM,
        "options": [
            *MLLM["options"],
            {"name": "L-tp2", "components": ["L"], "gpus": 2, "throughput": 10.0},
        ],
    }
    model = build_model(parse_spec(data))
    assert model.tau["L"] == pytest.approx(1 / 6)
    assert model.seconds("L-tp2", frozenset({"L"})) == pytest.approx(1 / 10)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d["options"][0].update(throughput=0),
            "option 'E': throughput must be a finite number > 0 req/s, got 0",
        ),
        (
            lambda d: d["options"][0].update(throughput=-1.5),
            "throughput must be a finite number > 0 req/s, got -1.5",
        ),
        (
            lambda d: d["options"][0].update(throughput=float("inf")),
            "throughput must be a finite number > 0",
        ),
        (
            lambda d: d["options"][0].update(gpus=0),
            "options.0.gpus: Input should be greater than or equal to 1",
        ),
        (lambda d: d["request_types"][0].update(share=0), "request type 'text': share must be > 0"),
        (
            lambda d: d["request_types"][0].update(share=float("nan")),
            "request type 'text': share must be > 0",
        ),
        (lambda d: d.update(max_cell_gpus=0), "max_cell_gpus: Input should be greater than or equal to 1"),
        (lambda d: d.update(max_cell_gpus=8192), "max_cell_gpus: Input should be less than or equal to 4096"),
        (lambda d: d.update(max_cell_gpus=100), "must be a power of two (the largest cell's GPUs), got 100"),
        (
            lambda d: d["options"][2].update(deployable=False),
            "option 'EL': `deployable: false` marks a solo profile of one component",
        ),
        (
            lambda d: (
                d["options"][0].update(deployable=False),
                d["request_types"][1].update(paths=[["E", "L"]]),
            ),
            "request type 'image': path E->L runs ['E'], marked `deployable: false`",
        ),
        (
            lambda d: d.update(options={"E": [1]}),
            "options.E: give its fields as a mapping (components, ...), got list",
        ),
        (
            lambda d: d.update(request_types={"text": {**d["request_types"][0], "name": "chat"}}),
            "request_types.text: `name: chat` disagrees with its key; drop `name` or make them equal",
        ),
        (
            lambda d: d["request_types"][0].update(components=["L", "X"]),
            "request type 'text' names unknown components ['X']",
        ),
        (
            lambda d: d["options"][2].update(components=["E", "E"]),
            "option 'EL': component 'E' is listed twice",
        ),
        (lambda d: d["options"][2].update(name="E->L"), "names may not contain '->'"),
        (lambda d: d["options"][2].update(name="E"), "option 'E' is listed twice"),
        (lambda d: d["request_types"][1].update(paths=[]), "`paths` is empty"),
        (lambda d: d.update(extra=1), "extra: Extra inputs are not permitted"),
        (
            lambda d: d["options"][1].update(role_seconds={"text": {"E": 1.0}}),
            "role_seconds['text']['E'] names components ['E'] it does not run",
        ),
        (
            lambda d: d["options"][2].update(role_seconds={"text": {"L": 0}}),
            "role_seconds['text']['L'] must be > 0 s",
        ),
        (
            lambda d: d.update(
                topology={"nodes": [{"name": "a", "gpus": 2}], "bandwidth": 1, "edge_bytes": {"E->Q": 1}}
            ),
            "edge_bytes key 'E->Q' names unknown options ['Q']",
        ),
    ],
)
def test_malformed_specs_say_what_to_fix(change, message):
    import json

    data = json.loads(json.dumps(MLLM))
    change(data)
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_load_spec_reads_yaml_and_json_and_names_the_file(tmp_path):
    import json

    (tmp_path / "spec.json").write_text(json.dumps(MLLM))
    assert load_spec(tmp_path / "spec.json").components == ["E", "L"]
    (tmp_path / "bad.yaml").write_text("components: [E, L\n")
    with pytest.raises(SpecError, match="bad.yaml: not valid YAML"):
        load_spec(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SpecError, match="a plan spec is a mapping"):
        load_spec(tmp_path / "list.yaml")
    with pytest.raises(SpecError, match="absent.yaml: cannot read"):
        load_spec(tmp_path / "absent.yaml")


def test_the_worked_examples_parse():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "docs" / "examples"
    omni = load_spec(examples / "qwen25_omni.yaml")
    assert len(omni.components) == 6 and len(omni.options) >= 12 and len(omni.request_types) == 8
    assert load_spec(examples / "internvl3.yaml").components == ["E", "P", "D"]


MAPPED_YAML = """
components: [E, L]
options:
  E:  {components: [E],    gpus: 1, throughput: 20.0}
  L:  {components: [L],    gpus: 1, throughput: 6.0}
  EL: {components: [E, L], gpus: 1, throughput: 4.0, name: EL}
request_types:
  text:  {components: [L],    share: 30}
  image: {components: [E, L], share: 70}
"""


def test_options_and_request_types_may_be_mappings_keyed_by_name_with_raw_count_shares(tmp_path):
    from prismserve.planner import plan_for_budget

    (tmp_path / "spec.yaml").write_text(MAPPED_YAML)
    mapped = load_spec(tmp_path / "spec.yaml")
    listed = parse_spec(MLLM)
    assert [t.share for t in mapped.request_types] == pytest.approx([0.3, 0.7])
    assert mapped.model_dump() == listed.model_dump()  # 30/100 and 70/100 are exactly 0.3 and 0.7
    assert plan_for_budget(mapped, 8).model_dump() == plan_for_budget(listed, 8).model_dump()


def test_shares_are_normalised_to_sum_to_one():
    def with_shares(text: float, image: float):
        data = json.loads(json.dumps(MLLM))
        data["request_types"][0]["share"], data["request_types"][1]["share"] = text, image
        return build_model(parse_spec(data))

    reference = build_model(parse_spec(MLLM))
    for text, image in ((3, 7), (0.15, 0.35), (300.0, 700.0)):
        model = with_shares(text, image)
        assert sum(t.share for t in model.spec.request_types) == pytest.approx(1.0)
        assert model.tau == pytest.approx(reference.tau) and model.alpha == pytest.approx(reference.alpha)
    assert [t.share for t in with_shares(1, 3).spec.request_types] == [0.25, 0.75]


def test_the_largest_cell_comes_from_the_spec_unless_the_caller_gives_one():
    from prismserve.planner import plan_for_budget, plan_for_target

    capped = parse_spec({**MLLM, "max_cell_gpus": 4})
    plan = plan_for_budget(capped, 64)
    assert plan.max_cell_gpus == 4 and max(c.gpus for c in plan.cells) <= 4
    assert plan.model_dump() == plan_for_budget(parse_spec(MLLM), 64, max_exponent=2).model_dump()
    assert plan.throughput < plan_for_budget(parse_spec(MLLM), 64).throughput  # 64-GPU cells do better
    assert plan_for_budget(parse_spec(MLLM), 64).max_cell_gpus == 64  # DEFAULT_MAX_EXPONENT
    wider = plan_for_budget(capped, 64, max_exponent=5)
    assert wider.max_cell_gpus == 32
    assert wider.model_dump() == plan_for_budget(parse_spec(MLLM), 64, max_exponent=5).model_dump()
    target = plan_for_target(capped, 100.0)
    assert target.max_cell_gpus == 4 and max(c.gpus for c in target.cells) <= 4


SOLO_E = {
    **MLLM,
    "options": [{**MLLM["options"][0], "deployable": False}, *MLLM["options"][1:]],
}


def test_a_solo_only_profile_gives_tau_but_is_never_deployed_or_routed_through():
    from prismserve.planner import max_throughput, min_gpus, plan_for_budget, plan_for_target

    solo = build_model(parse_spec(SOLO_E))
    deployable = build_model(parse_spec(MLLM))
    assert solo.tau == pytest.approx(deployable.tau) and solo.alpha == pytest.approx(deployable.alpha)
    # E runs only inside the colocated EL: image requests have that one path.
    assert [p.name for p in solo.paths["image"]] == ["EL"]
    assert sorted(p.name for p in solo.paths["text"]) == ["EL", "L"]
    # The same as the deployable spec restricted to paths that avoid E.
    restricted = json.loads(json.dumps(MLLM))
    restricted["request_types"][0]["paths"] = [["L"], ["EL"]]
    restricted["request_types"][1]["paths"] = [["EL"]]
    for budget in (1, 3, 8, 20):
        solved = max_throughput(solo, budget)
        assert "E" not in solved.replicas
        assert solved.throughput == pytest.approx(
            max_throughput(build_model(parse_spec(restricted)), budget).throughput
        )
    assert "E" not in min_gpus(solo, 25.0).replicas
    for plan in (plan_for_budget(parse_spec(SOLO_E), 16), plan_for_target(parse_spec(SOLO_E), 50.0)):
        assert all("E" not in cell.replicas for cell in plan.cells)
        assert plan.routing["image"] == {"EL": 1.0}
        assert all("E" not in path.split("->") for paths in plan.routing.values() for path in paths)
    assert (
        plan_for_budget(parse_spec(SOLO_E), 16).throughput < plan_for_budget(parse_spec(MLLM), 16).throughput
    )


def test_a_solo_only_profile_is_never_placed_on_a_topology():
    from prismserve.planner import plan_on_topology

    data = {**SOLO_E, "topology": {"nodes": [{"name": "a", "gpus": 4}], "bandwidth": 1e9}}
    plan = plan_on_topology(parse_spec(data), gpus=4)
    assert plan.throughput > 0 and all("E" not in cell.replicas for cell in plan.cells)
    assert plan.routing["image"] == {"EL": 1.0}
