"""Structured replies: the JSON Schema a chat request's reply must follow (`response_format`, a
forced tool call) and the tool calls read back from the reply.

The schema travels with the request to the LLM, whose engine enforces it with a grammar (llguidance,
on vLLM and on transformers alike); here it is only compiled once, so that a schema the grammar
cannot follow is a 400 before any work starts. How the calls come back depends on `tool_choice`:
- a named function: the reply is that function's arguments (its `parameters` schema);
- `required`: the reply is a JSON array of `{"name", "arguments"}` calls, one of the tools each;
- `auto` (the default with tools): the model decides; calls are read from the reply in the form
  Qwen's chat templates teach (Hermes': `<tool_call>{"name": …, "arguments": …}</tool_call>`), the
  text around them is the content;
- `none`: the tools are not shown to the model.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from prismserve.errors import InvalidRequestError
from prismserve.protocol.openai import (
    JSONObjectFormat,
    JSONSchemaResponseFormat,
    NamedToolChoice,
    OpenAIChatRequest,
)

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ReplyShape:
    """What a chat request asks of its reply's shape: the JSON Schema it follows (None: any text),
    the functions the model is shown (chat-template form) and how its tool calls are read back."""

    schema: dict[str, Any] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    calls: Literal["none", "auto", "required", "named"] = "none"
    function: str = ""  # the named function

    @property
    def has_calls(self) -> bool:
        """Whether the reply may hold tool calls (then a stream sends it whole, once read)."""
        return self.calls != "none"

    def read(self, text: str, finish_reason: str) -> tuple[str | None, list[dict[str, Any]], str]:
        """The reply's content (None: tool calls alone), its tool calls in the API's form and its
        finish reason ("tool_calls" when the model chose to call; "stop" for a named function, as
        OpenAI answers). A reply cut short keeps its text as content."""
        if self.calls == "named":
            if finish_reason == "length":
                return text, [], finish_reason
            return None, [_call(self.function, text)], finish_reason
        if self.calls == "required":
            try:
                calls = [_call(c["name"], json.dumps(c["arguments"])) for c in json.loads(text)]
            except (ValueError, TypeError, KeyError):
                return text, [], finish_reason
            return None, calls, "tool_calls"
        if self.calls == "auto":
            calls = [call for found in _CALL.findall(text) if (call := _hermes(found)) is not None]
            if calls:
                content = _CALL.sub("", text).strip()
                return content or None, calls, "tool_calls" if finish_reason == "stop" else finish_reason
        return text, [], finish_reason


def reply_shape(body: OpenAIChatRequest) -> ReplyShape:
    """The reply's shape a request asks for; a 400 for a schema the grammar cannot follow, or for a
    forced tool call beside a `response_format` (the reply cannot be both)."""
    choice = body.tool_choice or ("auto" if body.tools else "none")
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools or ()] if choice != "none" else []
    for tool in tools:
        tool["function"].pop("strict", None)  # the grammar holds every forced call to its schema
    schema = _format_schema(body)
    if isinstance(choice, NamedToolChoice):
        if schema is not None:
            raise InvalidRequestError("a named tool_choice cannot go with a JSON response_format: send one")
        name = choice.function.name
        parameters = next(t["function"].get("parameters") for t in tools if t["function"]["name"] == name)
        shape = ReplyShape(
            _checked(parameters or {"type": "object"}, "the tool's parameters"), tools, "named", name
        )
    elif choice == "required":
        if schema is not None:
            raise InvalidRequestError(
                "tool_choice 'required' cannot go with a JSON response_format: send one"
            )
        shape = ReplyShape(_checked(_calls_schema(body, tools), "the tools' parameters"), tools, "required")
    else:
        shape = ReplyShape(schema, tools, choice)
    return shape


def _format_schema(body: OpenAIChatRequest) -> dict[str, Any] | None:
    fmt = body.response_format
    if isinstance(fmt, JSONObjectFormat):
        return {"type": "object"}
    if isinstance(fmt, JSONSchemaResponseFormat):
        return _checked(fmt.json_schema.schema_, "response_format.json_schema.schema")
    return None


def _calls_schema(body: OpenAIChatRequest, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON Schema of `tool_choice: required`'s reply: an array of calls, each one of the tools."""
    one = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": one}}
    if body.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return schema


def _checked(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """`schema` once llguidance compiles it (what the engines will run); else a 400 saying why."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        error = llguidance.LLMatcher.validate_grammar(grammar)
    except Exception as exc:  # noqa: BLE001 - whatever llguidance says of a schema is the client's to fix
        error = str(exc)
    if error:
        raise InvalidRequestError(f"{where}: the JSON Schema cannot be followed: {error}")
    return schema


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _hermes(found: str) -> dict[str, Any] | None:
    """One call written as `{"name": …, "arguments": {…}}` (None: not such a call)."""
    try:
        call = json.loads(found)
        name, arguments = call["name"], call.get("arguments", {})
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(name, str):
        return None
    return _call(name, arguments if isinstance(arguments, str) else json.dumps(arguments))
