"""The package's shape: one definition per class name, and no test fixture imported by it."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import prismserve

PACKAGE = Path(prismserve.__file__).parent


def _modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in PACKAGE.rglob("*.py")}


def test_no_class_name_is_defined_twice_in_the_package():
    names = Counter(
        node.name for tree in _modules().values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
    )
    assert names and [name for name, count in names.items() if count > 1] == []


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
