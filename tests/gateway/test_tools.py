"""The reply's shape a chat request asks for (`gateway/tools.py`): the JSON Schema its engine holds it
to, and its tool calls read back as the API answers them."""

from __future__ import annotations

import json

import pytest

from prismserve.errors import InvalidRequestError
from prismserve.gateway.tools import reply_shape
from prismserve.protocol.openai import OpenAIChatRequest

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": CITY, "strict": True}},
    {"type": "function", "function": {"name": "time"}},
]


def shape(**fields):
    return reply_shape(OpenAIChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields))


def test_without_tools_or_format_the_reply_is_free_text():
    plain = shape()
    assert (plain.schema, plain.tools, plain.has_calls) == (None, [], False)
    assert plain.read("hello", "stop") == ("hello", [], "stop")


def test_response_formats_become_the_schema_the_engine_follows():
    assert shape(response_format={"type": "json_object"}).schema == {"type": "object"}
    named = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    assert shape(response_format=named).schema == CITY
    assert shape(response_format={"type": "text"}).schema is None


def test_a_named_function_is_its_arguments():
    forced = shape(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "weather"}})
    assert forced.schema == CITY and [t["function"]["name"] for t in forced.tools] == ["weather", "time"]
    assert "strict" not in forced.tools[0]["function"]
    content, calls, finish = forced.read('{"city":"Oslo"}', "stop")
    assert content is None and finish == "stop"
    assert [c["function"] for c in calls] == [{"name": "weather", "arguments": '{"city":"Oslo"}'}]
    assert forced.read('{"city":"Os', "length") == ('{"city":"Os', [], "length")  # cut short: the text


def test_required_is_an_array_of_calls_of_the_tools():
    required = shape(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert required.schema["maxItems"] == 1 and required.schema["minItems"] == 1
    names = [one["properties"]["name"]["const"] for one in required.schema["items"]["anyOf"]]
    assert names == ["weather", "time"]
    text = json.dumps([{"name": "time", "arguments": {}}, {"name": "weather", "arguments": {"city": "Oslo"}}])
    content, calls, finish = required.read(text, "stop")
    assert content is None and finish == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("time", {}),
        ("weather", {"city": "Oslo"}),
    ]
    assert len({c["id"] for c in calls}) == 2 and all(c["id"].startswith("call_") for c in calls)


def test_auto_reads_calls_in_the_templates_form_and_keeps_the_text_around_them():
    auto = shape(tools=TOOLS)
    assert auto.calls == "auto" and auto.schema is None and auto.has_calls
    text = 'Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls, finish = auto.read(text, "stop")
    assert content == "Let me check." and finish == "tool_calls"
    assert calls[0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert auto.read("<tool_call>not json</tool_call>", "stop") == (
        "<tool_call>not json</tool_call>",
        [],
        "stop",
    )
    assert auto.read("just text", "stop") == ("just text", [], "stop")


def test_tool_choice_none_hides_the_tools():
    hidden = shape(tools=TOOLS, tool_choice="none")
    assert (hidden.tools, hidden.has_calls) == ([], False)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
            "cannot be followed",
        ),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "cannot go with a JSON response_format",
        ),
    ],
)
def test_what_cannot_be_followed_is_a_400_before_any_work(fields, message):
    with pytest.raises(InvalidRequestError, match=message):
        shape(**fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tool_choice": "auto"}, "tool_choice needs tools"),
        ({"tools": [TOOLS[1], TOOLS[1]]}, "a name of its own"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "tool message needs tool_call_id"),
        ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "only a tool message"),
    ],
)
def test_tool_fields_that_do_not_fit_together_do_not_validate(fields, message):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(ValueError, match=message):
        OpenAIChatRequest.model_validate(body)


def test_a_response_formats_description_is_refused_not_ignored():
    with pytest.raises(ValueError, match="description"):
        OpenAIChatRequest.model_validate(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "description": "d"}},
            }
        )
