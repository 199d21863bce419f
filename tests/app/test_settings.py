"""App modules with settings: the `SETTINGS` statement written for other settings evaluates back to
them, and the rest of the module is kept as it is."""

from __future__ import annotations

import math

import pytest

from prismserve.app import AppSettings, app_module_source, load_app_source
from prismserve.app.settings import literal, settings_statement
from prismserve.apps import ImageAppSettings, OmniAppSettings


@pytest.mark.parametrize(
    "value",
    [
        "plain", 'say "hi"', "it's", "both ' and \"", "back\\slash\nnewline", "",
        None, True, 3, 0.4, 2.0, ("image",), ("image", "video"), (), [1, "a"],
        {"dtype": "bfloat16", "engine_args": {"gpu_memory_utilization": 0.5}}, {},
        frozenset({"text", "audio"}), frozenset(),
    ],
)  # fmt: skip
def test_a_setting_is_written_as_an_expression_that_evaluates_back_to_it(value):
    assert eval(literal(value)) == value and type(eval(literal(value))) is type(value)  # noqa: S307


def test_infinity_and_strings_as_ruff_formats_them():
    assert math.isinf(eval(literal(float("inf")))) and literal("a/b") == '"a/b"'  # noqa: S307
    assert literal('say "hi"') == "'say \"hi\"'"  # double quotes inside: ruff keeps single quotes


def test_the_statement_shows_required_settings_and_those_not_at_their_default():
    settings = OmniAppSettings(model="/ckpt/o", max_codes=50, engine="transformers")
    assert settings_statement("OmniAppSettings", settings) == (
        'SETTINGS = OmniAppSettings(\n    model="/ckpt/o",\n    max_codes=50,\n)'
    )


class Other(AppSettings):
    """Settings of no app module."""

    model: str


def test_the_settings_must_be_those_of_the_module():
    with pytest.raises(
        TypeError, match="prismserve.apps.image.SETTINGS is a ImageAppSettings, not the Other"
    ):
        app_module_source("prismserve.apps.image", Other(model="x"))


def test_the_written_module_keeps_everything_but_its_settings_and_docstring():
    import inspect

    from prismserve.apps import image

    original = inspect.getsource(image)
    written = app_module_source(
        "prismserve.apps.image", ImageAppSettings(model="/i"), doc='A "quoted" """doc"""'
    )
    assert written.startswith('"""A "quoted" \\"""doc\\""\\""""\n') and 'model="/i",' in written
    assert (
        written.split("SETTINGS = ")[0].split('"""\n', 2)[-1]
        == original.split("SETTINGS = ")[0].split('"""\n', 1)[1]
    )
    assert load_app_source(written, "image").module.__doc__ == 'A "quoted" """doc"""'
