"""The package's shape: its rooms and what each may import (docs/architecture.md), one request
context, one definition per class name, no test fixture imported by it, and no app kept as source
in a string."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import prismserve

PACKAGE = Path(prismserve.__file__).parent

# Floors from the bottom up (docs/architecture.md): a room imports only rooms on its own floor or
# below. Top-level modules are rooms of their own (`errors`, `offline`, `cli`, `demo`).
FLOORS = {
    "__init__": 0,  # the package itself: its version, telemetry off
    "errors": 0,
    "offline": 0,
    "protocol": 0,
    "observability": 0,
    "task": 1,
    "planner": 1,
    "models": 1,
    "bench": 1,
    "app": 2,
    "tasklib": 2,
    "executors": 2,
    "apps": 3,
    "runtime": 3,
    "control": 4,
    "profile": 4,
    "emulate": 4,
    "gateway": 5,
    "serve": 6,
    "cli": 6,
    "demo": 6,
    "__main__": 6,
}
# What a room may not import although the floors allow it.
BANNED = {
    "protocol": set(FLOORS) - {"protocol"},  # the wire types every layer shares stand alone
    "gateway": {"planner", "models", "profile", "executors", "emulate"},  # HTTP only
    "executors": {"tasklib"},  # the task library names its executors, not the other way round
    "runtime": {"emulate"},  # serving code never imports the emulated models
    "control": {"emulate"},
}


def _modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in PACKAGE.rglob("*.py")}


ROOMS = {
    path.stem if path.suffix else path.name
    for path in PACKAGE.iterdir()
    if path.suffix == ".py" or path.is_dir()
}


def _room(module: str) -> str:
    """`prismserve.gateway.http` -> `gateway`; the package itself (and names it holds) -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "__init__"


def _imports() -> list[tuple[str, str, str]]:
    """(importing room, imported room, module) for every import of prismserve in the package,
    those inside functions and under TYPE_CHECKING included."""
    found = []
    for path, tree in _modules().items():
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        module = ".".join(("prismserve", *parts))
        room = _room(module)
        for name in _imported_modules(tree, module):
            if name.split(".")[0] == "prismserve" and _room(name) != room:
                found.append((room, _room(name), f"{path.relative_to(PACKAGE.parent)}: imports {name}"))
    return found


def test_every_room_has_a_floor():
    rooms = {
        _room(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")
    }
    assert rooms <= set(FLOORS)


def test_no_room_imports_a_room_above_it_or_one_it_may_not():
    wrong = [
        where
        for room, imported, where in _imports()
        if FLOORS[imported] > FLOORS[room] or imported in BANNED.get(room, set())
    ]
    assert wrong == []


def test_the_request_state_is_one_context_variable_among_at_most_four():
    """A request's state is one typed context (task/context.py); the others are record & replay's."""
    made = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "ContextVar"
    ]
    assert len(made) <= 4, made
    assert sum(where.startswith("prismserve/task/context.py") for where in made) == 1


def _is_app_config(node: ast.ClassDef) -> bool:
    """An app module's `Config`: every app names its config class so (the loader looks it up)."""
    return node.name == "Config" and any(
        isinstance(base, ast.Name) and base.id == "AppConfig" for base in node.bases
    )


def test_no_class_name_is_defined_twice_in_the_package():
    names = Counter(
        node.name
        for tree in _modules().values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and not _is_app_config(node)
    )
    assert names and [name for name, count in names.items() if count > 1] == []


def test_no_app_source_is_kept_in_a_string():
    """Apps are modules that ruff and mypy read (prismserve.apps), not templates: no string literal of
    the package (docstrings and f-strings' constant parts included) holds an app's config class."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "class Config(AppConfig)" in node.value
    ]
    assert found == []


def test_nothing_in_the_package_imports_the_test_fixtures():
    imported = set()
    for tree in _modules().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
    assert "toy" not in imported and "tests" not in imported


def _imported_modules(tree: ast.Module, module: str) -> set[str]:
    """Every module `tree` (the module named `module`) imports, anywhere in it: at the top, inside
    functions, under TYPE_CHECKING; relative imports resolved, `from a import b` counted as `a.b`."""
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: -node.level]
                base = ".".join([*parent, base] if base else parent)
            imported.add(base)
            imported.update(f"{base}.{alias.name}" for alias in node.names)
    return imported


def test_no_executor_imports_the_task_library():
    """The executors meet the task library in the task layer's contract (`prismserve.task.components`),
    never by importing it: the task library may change without the engines, and the other way round."""
    offending = {}
    for path, tree in _modules().items():
        if "executors" not in path.relative_to(PACKAGE).parts[:1]:
            continue
        module = ".".join(("prismserve", *path.relative_to(PACKAGE).with_suffix("").parts))
        hits = {m for m in _imported_modules(tree, module) if m.split(".")[:2] == ["prismserve", "tasklib"]}
        if hits:
            offending[module] = sorted(hits)
    assert offending == {}


def test_the_import_walk_sees_imports_in_functions_under_type_checking_and_relative_ones():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from prismserve.tasklib.units import LLMTask\n"
        "def f():\n    import prismserve.tasklib.mllm\n"
        "from ..tasklib import omni\n"
        "from prismserve import tasklib\n"
    )
    imported = _imported_modules(ast.parse(source), "prismserve.executors.x")
    assert {
        "prismserve.tasklib.units",
        "prismserve.tasklib.mllm",
        "prismserve.tasklib.omni",
        "prismserve.tasklib",
    } <= imported
