"""Apps with settings: an app module keeps its parameters in one `SETTINGS = ...` statement, so the
module is real code that ruff and mypy check, and the app for other parameters is a copy of that
module with the one statement rewritten (what `prismserve serve MODEL` registers and
`--write-app FILE` writes)."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import math
import textwrap
from typing import Any

from pydantic import BaseModel, ConfigDict

SETTINGS_NAME = "SETTINGS"  # the name an app module binds its settings to
DOC_WIDTH = 100  # a written app's docstring lines, long ones wrapped (ruff's line length is 110)


class AppSettings(BaseModel):
    """The parameters of an app module, held by its `SETTINGS` statement; frozen and closed, so a
    misspelt setting is an error where the app is made, not a silent default."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def app_module_source(module: str, settings: AppSettings, doc: str | None = None) -> str:
    """The source of app module `module` (an import path) with its `SETTINGS` statement written for
    `settings`, and with `doc` (if given) as its docstring: a standalone app file."""
    imported = importlib.import_module(module)
    given = getattr(imported, SETTINGS_NAME, None)
    if type(given) is not type(settings):
        raise TypeError(
            f"{module}.SETTINGS is a {type(given).__name__}, not the {type(settings).__name__} given: "
            f"pass the settings class its `SETTINGS = ...` statement builds"
        )
    source = inspect.getsource(imported)
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    statement = _settings_statement(tree, module)
    call = (
        ast.get_source_segment(source, statement.value.func)
        if isinstance(statement.value, ast.Call)
        else None
    )
    if call is None:
        raise ValueError(f"{module}: `SETTINGS = ...` must call its settings class, as `SETTINGS = X(...)`")
    end = statement.end_lineno or statement.lineno
    rest = lines[end - 1][statement.end_col_offset or 0 :]  # a comment after the statement stays
    lines[statement.lineno - 1 : end] = [settings_statement(call, settings) + rest]
    if doc is not None:
        _replace_docstring(tree, lines, doc, module)
    text = "".join(lines)
    ast.parse(text)  # a bug here is ours: fail before anything registers or writes it
    return text


def settings_statement(call: str, settings: AppSettings) -> str:
    """`SETTINGS = call(...)` for `settings`: the required fields and those that differ from their
    defaults, one per line, as ruff formats them."""
    shown = []
    for name, field in type(settings).model_fields.items():
        value = getattr(settings, name)
        if field.is_required() or value != field.get_default(call_default_factory=True):
            shown.append(f"    {name}={literal(value)},\n")
    return f"{SETTINGS_NAME} = {call}(\n{''.join(shown)})" if shown else f"{SETTINGS_NAME} = {call}()"


def literal(value: Any) -> str:
    """`value` as a Python expression that evaluates back to it (pydantic models as dicts of their
    non-default fields, which validation turns back into them); strings double-quoted, as ruff
    formats them."""
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        value = {
            name: getattr(value, name)
            for name, field in fields.items()
            if field.is_required() or getattr(value, name) != field.get_default(call_default_factory=True)
        }
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({json.dumps(str(value))})"
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, tuple):
        items = [literal(item) for item in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, list):
        return f"[{', '.join(literal(item) for item in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, set | frozenset):
        items = sorted(literal(item) for item in value)
        return f"frozenset({{{', '.join(items)}}})" if items else "frozenset()"
    raise TypeError(f"cannot write a {type(value).__name__} setting into an app's source: {value!r}")


def _string(value: str) -> str:
    text = repr(value)
    if text.startswith("'") and '"' not in value and "'" not in value:
        return f'"{text[1:-1]}"'
    return text


def _settings_statement(tree: ast.Module, module: str) -> ast.Assign:
    found = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [target.id for target in node.targets if isinstance(target, ast.Name)] == [SETTINGS_NAME]
    ]
    if len(found) != 1:
        raise ValueError(
            f"{module}: an app module with settings assigns `SETTINGS = ...` once at module level, "
            f"not {len(found)} times"
        )
    return found[0]


def _replace_docstring(tree: ast.Module, lines: list[str], doc: str, module: str) -> None:
    first = tree.body[0] if tree.body else None
    if not (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        raise ValueError(f"{module}: an app module with settings starts with its docstring")
    wrapped = "\n".join(textwrap.fill(line, DOC_WIDTH) if line else "" for line in doc.strip().splitlines())
    text = wrapped.replace("\\", "\\\\").replace('"""', '\\"""')
    if text.endswith('"'):  # else it would run into the closing quotes
        text = text[:-1] + '\\"'
    closing = '\n"""' if "\n" in text else '"""'
    lines[first.lineno - 1 : first.end_lineno] = [f'"""{text}{closing}\n']
