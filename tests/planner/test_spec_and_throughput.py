"""The plan spec's validation and Algorithm 3 (000 Appendix C)."""

from __future__ import annotations

import pytest

from prismserve.planner import SpecError, build_model, load_spec, parse_spec

MLLM = {
    "components": ["E", "L"],
    "executors": [
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
        "executors": [
            *MLLM["executors"][:2],
            {**MLLM["executors"][2], "role_seconds": {"image": {"L": 0.02}}},
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


def test_a_component_only_inside_colocated_executors_is_rejected_by_name():
    data = {**MLLM, "executors": [MLLM["executors"][1], MLLM["executors"][2]]}
    with pytest.raises(SpecError, match="component 'E' has no executor that runs it alone"):
        parse_spec(data)


def test_a_second_singleton_keeps_its_own_speed_and_tau_comes_from_the_smallest():
    data = {
        **MLLM,
        "executors": [
            *MLLM["executors"],
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
            lambda d: d["executors"][0].update(throughput=0),
            "executor 'E': throughput must be a finite number > 0 req/s, got 0",
        ),
        (
            lambda d: d["executors"][0].update(throughput=-1.5),
            "throughput must be a finite number > 0 req/s, got -1.5",
        ),
        (
            lambda d: d["executors"][0].update(throughput=float("inf")),
            "throughput must be a finite number > 0",
        ),
        (
            lambda d: d["executors"][0].update(gpus=0),
            "executors.0.gpus: Input should be greater than or equal to 1",
        ),
        (lambda d: d["request_types"][0].update(share=0.5), "shares must sum to 1, they sum to 1.2"),
        (lambda d: d["request_types"][0].update(share=0), "request type 'text': share must be > 0"),
        (
            lambda d: d["request_types"][0].update(components=["L", "X"]),
            "request type 'text' names unknown components ['X']",
        ),
        (
            lambda d: d["executors"][2].update(components=["E", "E"]),
            "executor 'EL': component 'E' is listed twice",
        ),
        (lambda d: d["executors"][2].update(name="E->L"), "names may not contain '->'"),
        (lambda d: d["executors"][2].update(name="E"), "executor 'E' is listed twice"),
        (lambda d: d["request_types"][1].update(paths=[]), "`paths` is empty"),
        (lambda d: d.update(extra=1), "extra: Extra inputs are not permitted"),
        (
            lambda d: d["executors"][1].update(role_seconds={"text": {"E": 1.0}}),
            "role_seconds['text']['E'] names components ['E'] it does not run",
        ),
        (
            lambda d: d["executors"][2].update(role_seconds={"text": {"L": 0}}),
            "role_seconds['text']['L'] must be > 0 s",
        ),
        (
            lambda d: d.update(
                topology={"nodes": [{"name": "a", "gpus": 2}], "bandwidth": 1, "edge_bytes": {"E->Q": 1}}
            ),
            "edge_bytes key 'E->Q' names unknown executors ['Q']",
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
    assert len(omni.components) == 6 and len(omni.executors) >= 12 and len(omni.request_types) == 8
    assert load_spec(examples / "internvl3.yaml").components == ["E", "P", "D"]
