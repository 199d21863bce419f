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
