"""Test tiers: a test is marked by what it uses (a Ray cluster, a vLLM engine, a `prismserve serve`
subprocess, a benchmark script), and each of those marks it `slow` too, so that
`pytest -m "not slow"` is the quick tier for local work and `pytest` runs everything.

What a test uses is read from the fixtures it requests (directly or through other fixtures) and the
functions it calls (directly or through other functions of the test modules), where a fixture or
helper declares what it starts with `@uses(...)`; a marker written on a test counts too.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest

TESTS = Path(__file__).resolve().parent
SLOW = "slow"
# Each marks a test slow; `pyproject.toml` registers them (`pytest --markers`).
TIERS = ("ray", "vllm", "serve", "bench_script")

F = TypeVar("F", bound=Callable[..., Any])


def uses(*tiers: str) -> Callable[[F], F]:
    """Declare that a fixture or test helper starts what `tiers` name: every test that requests the
    fixture or calls the helper gets those marks, and `slow`."""
    unknown = set(tiers) - set(TIERS)
    if unknown:
        raise ValueError(f"unknown test tiers {sorted(unknown)}: use some of {', '.join(TIERS)}")

    def declare(function: F) -> F:
        function.__test_tiers__ = frozenset(tiers)  # type: ignore[attr-defined]
        return function

    return declare


def mark_tiers(items: Iterable[pytest.Item]) -> None:
    """Add to each test the tiers it uses, and `slow` where it uses any."""
    for item in items:
        found = tiers_of(item)
        for name in sorted(found - {m.name for m in item.iter_markers()}):
            item.add_marker(name)
        if found and item.get_closest_marker(SLOW) is None:
            item.add_marker(SLOW)


def tiers_of(item: pytest.Item) -> set[str]:
    """The tiers `item` uses: its markers', its fixtures' and the functions' it calls."""
    found = {m.name for m in item.iter_markers() if m.name in TIERS}
    functions = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name in info.names_closure:
            functions += [definition.func for definition in info.name2fixturedefs.get(name, ())]
    seen: set[int] = set()
    for function in functions:
        found |= _declared(function, seen)
    return found


def _declared(function: object, seen: set[int]) -> set[str]:
    """The tiers declared on `function` (or what it wraps) and on the functions of the test modules
    it refers to."""
    found: set[str] = set()
    layers = []
    while function is not None and id(function) not in seen:
        seen.add(id(function))
        found |= getattr(function, "__test_tiers__", frozenset())
        layers.append(function)
        function = getattr(function, "__wrapped__", None) or getattr(function, "__func__", None)
    for layer in layers:
        if isinstance(layer, types.FunctionType) and _in_tests(layer.__code__.co_filename):
            for name in _names(layer.__code__):
                value = layer.__globals__.get(name)
                if callable(value):
                    found |= _declared(value, seen)
    return found


@functools.cache
def _in_tests(filename: str) -> bool:
    return Path(filename).resolve().is_relative_to(TESTS)


def _names(code: types.CodeType) -> set[str]:
    """The global names `code` and the functions, lambdas and comprehensions in it refer to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names
