"""Files an earlier version wrote still load: specs (cached profiles, users' spec.yaml) and plans
(`plan.json`) that name their deployment options `executors`, the key's old name. New files say
`options`; a file giving both is refused, since which one was meant cannot be told."""

from __future__ import annotations

import json

import pytest

from prismserve.planner import Plan, SpecError, load_plan, load_spec, parse_spec, plan_for_budget
from prismserve.profile import spec_document

OLD_SPEC = """
components: [E, L]
executors:
  E:  {components: [E],    gpus: 1, throughput: 20.0}
  L:  {components: [L],    gpus: 1, throughput: 6.0}
  EL: {components: [E, L], gpus: 1, throughput: 4.0}
request_types:
  text:  {components: [L],    share: 0.3}
  image: {components: [E, L], share: 0.7}
"""

NEW_SPEC = OLD_SPEC.replace("executors:", "options:")

NEW_PLAN = {
    "options": {"E": {"mllm.encoders.image": 1.0}, "EL": {"mllm.encoders.image": 0.25, "mllm.llm": 0.75}},
    "cells": [{"gpus": 2, "replicas": {"E": 1, "EL": 1}}],
    "routing": {"image+text": {"E->EL": 0.5, "EL": 0.5}, "text": {"EL": 1.0}},
}
OLD_PLAN = {("executors" if key == "options" else key): value for key, value in NEW_PLAN.items()}


def test_an_old_spec_loads_as_the_new_one_and_is_written_back_with_options(tmp_path):
    (tmp_path / "old.yaml").write_text(OLD_SPEC)
    (tmp_path / "new.yaml").write_text(NEW_SPEC)
    old, new = load_spec(tmp_path / "old.yaml"), load_spec(tmp_path / "new.yaml")
    assert old.model_dump() == new.model_dump() and [o.name for o in old.options] == ["E", "L", "EL"]
    assert plan_for_budget(old, 8).model_dump() == plan_for_budget(new, 8).model_dump()
    written = spec_document(old, {"profile of": "mllm"})
    assert "\noptions:\n" in written and "executors" not in written


def test_a_spec_giving_both_keys_is_refused_in_one_line_that_says_which_to_keep(tmp_path):
    (tmp_path / "both.yaml").write_text(
        NEW_SPEC + "executors:\n  E: {components: [E], gpus: 1, throughput: 20.0}\n"
    )
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "both.yaml")
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'both.yaml'}: both `options` and `executors` are given")
    assert "keep only `options`" in message and "\n" not in message


def test_an_old_plan_loads_as_the_new_one_and_is_written_back_with_options(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps(OLD_PLAN))
    old = load_plan(tmp_path / "plan.json")
    assert old == Plan.model_validate(NEW_PLAN) and old.options == NEW_PLAN["options"]
    assert old == Plan.model_validate(OLD_PLAN, strict=True)  # as the admin API reads a posted plan
    written = old.to_json_dict()
    assert written["options"] == NEW_PLAN["options"] and "executors" not in written


def test_a_plan_giving_both_keys_is_refused_with_what_to_keep(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({**OLD_PLAN, **NEW_PLAN}))
    with pytest.raises(SpecError, match="both `options` and `executors` are given.*keep only `options`"):
        load_plan(tmp_path / "plan.json")
    with pytest.raises(ValueError, match="keep only `options`"):
        Plan.model_validate({**OLD_PLAN, "options": {}}, strict=True)


def test_a_spec_parsed_from_data_accepts_the_old_key_too():
    data = {
        "components": ["L"],
        "executors": [{"name": "L", "components": ["L"], "gpus": 1, "throughput": 3.0}],
        "request_types": [{"name": "text", "components": ["L"], "share": 1.0}],
    }
    assert [o.name for o in parse_spec(data).options] == ["L"]
