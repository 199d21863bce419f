"""The package's shape: one definition per class name, no test fixture imported by it, and no app kept
as source in a string."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import prismserve

PACKAGE = Path(prismserve.__file__).parent


def _modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in PACKAGE.rglob("*.py")}


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
