"""Checks of the chat completions API's sampling contract that any engine must pass, through the
official `openai` client: used on the transformers engine (tests/models/test_openai_conformance.py)
and on vLLM's (tests/runtime/test_models_on_ray.py)."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pydantic
import pytest


def check_sampling(client: openai.OpenAI, model: str, prompt_tokens: int) -> None:
    """Finish reasons, usage (the prompt is `prompt_tokens` long), stop strings, seeds and
    log-probabilities as the API promises them."""

    def ask(**options):
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell me a story about a robot."}], **options
        )

    cut_short = ask(max_tokens=5, temperature=0)
    assert cut_short.choices[0].finish_reason == "length"
    usage = cut_short.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        prompt_tokens,
        5,
        prompt_tokens + 5,
    )
    whole = ask(max_tokens=16, temperature=0).choices[0].message.content
    stop = whole[5:8]
    stopped = ask(max_tokens=16, temperature=0, stop=[stop])
    assert stopped.choices[0].message.content == whole[: whole.find(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    drawn = [ask(max_tokens=8, temperature=1.5, seed=seed).choices[0].message.content for seed in (3, 3, 4)]
    assert drawn[0] == drawn[1] != drawn[2]
    entries = ask(max_tokens=4, temperature=0, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    assert len(entries) == 4
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in entries)


class Person(pydantic.BaseModel):
    """What a structured answer holds: bounded fields, so that a random model's reply ends."""

    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    kind: Literal["robot", "person"]


def check_structured(client: openai.OpenAI, model: str) -> None:
    """JSON replies and tool calls as the API promises them, whatever the weights (the grammar holds
    an untrained model to the schema): the `parse` helpers read a `Person` out of a JSON-schema
    answer and out of a forced tool call; `tool_choice: required` answers `tool_calls`."""
    messages = [{"role": "user", "content": "Describe a robot."}]
    parsed = client.chat.completions.parse(
        model=model, messages=messages, response_format=Person, max_tokens=60, temperature=0
    )
    choice = parsed.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person)
    Person.model_validate_json(choice.message.content)  # the text itself, strictly
    sampled = client.chat.completions.create(
        model=model,
        messages=messages,
        response_format={"type": "json_object"},
        max_tokens=8,
        seed=1,
        temperature=1,
    )
    assert sampled.choices[0].message.content.startswith("{")
    tool = openai.pydantic_function_tool(Person, name="record")
    called = client.chat.completions.parse(
        model=model,
        messages=messages,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "record"}},
        max_tokens=60,
        temperature=0,
    )
    call = called.choices[0].message.tool_calls[0]
    assert called.choices[0].message.content is None and call.function.name == "record"
    assert isinstance(call.function.parsed_arguments, Person)
    weather = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    tools = [tool, {"type": "function", "function": {"name": "weather", "parameters": weather}}]
    required = client.chat.completions.create(
        model=model, messages=messages, tools=tools, tool_choice="required", max_tokens=80, temperature=0
    )
    answer = required.choices[0]
    assert answer.finish_reason == "tool_calls" and answer.message.tool_calls
    for made in answer.message.tool_calls:
        assert made.function.name in ("record", "weather") and made.id.startswith("call_")
        arguments = json.loads(made.function.arguments)
        assert (
            Person.model_validate(arguments)
            if made.function.name == "record"
            else arguments["city"] in ("Paris", "Oslo")
        )
    streamed = list(
        client.chat.completions.create(
            model=model,
            messages=messages,
            tools=tools,
            tool_choice="required",
            max_tokens=80,
            temperature=0,
            stream=True,
        )
    )
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    calls = [call for delta in deltas for call in delta.tool_calls or ()]
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in answer.message.tool_calls
    ]
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "tool_calls"
    made = {"name": call.function.name, "arguments": call.function.arguments}
    follow_up = [
        *messages,
        {"role": "assistant", "tool_calls": [{"id": call.id, "type": "function", "function": made}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"stored": true}'},
    ]
    after = client.chat.completions.create(
        model=model, messages=follow_up, tools=[tool], max_tokens=4, temperature=0
    )
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert after.usage.prompt_tokens > parsed.usage.prompt_tokens  # the call and its result were read


def check_context(client: openai.OpenAI, model: str, context: int) -> None:
    """What does not fit the model's `context` tokens is a 400 `context_length_exceeded`: a
    `max_tokens` that leaves no room for a prompt (the gateway's check, before any work) and a
    prompt longer than the context (the engine's, which alone counts its tokens)."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=context
        )
    assert refused.value.code == "context_length_exceeded"
    long = [
        {"role": "user", "content": "robot " * (context // 5)}
    ]  # six tokens a word on the tiny tokenizers
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=model, messages=long, max_tokens=2)
    assert too_long.value.code == "context_length_exceeded", too_long.value.message
