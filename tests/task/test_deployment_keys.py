"""Deployment keys are equal for equal configuration in every process; unserialisable configuration
is refused when the unit task is built, naming the class and the field."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from pydantic import BaseModel, Field

from prismserve.task import TaskDefinitionError, TaskInput, TaskOutput, UnitTask


class In(TaskInput):
    x: int


class Out(TaskOutput):
    y: int


class Sampling(BaseModel):
    stop: frozenset[str] = frozenset()
    temperature: float = 0.0


class Configured(UnitTask[In, Out]):
    executor_kind = "configured"
    tags: frozenset[str] = frozenset()
    names: set[str] = Field(default_factory=set)
    scale: float = 0.0
    sampling: Sampling = Sampling()
    nested: dict[str, list[set[int]]] = Field(default_factory=dict)
    blob: bytes = b""
    anything: object = None


def test_key_of_a_set_field_is_equal_under_any_hash_seed():
    code = (
        "import sys; sys.path.insert(0, 'tests/task');"
        "from test_deployment_keys import Configured, Sampling;"
        "print(Configured(tags=frozenset('abcdefgh'), names={'x', 'y', 'z', 'w'},"
        " sampling=Sampling(stop=frozenset({'</s>', 'END', 'stop'})), nested={'k': [set(range(40, 0, -3))]})"
        ".deployment_key())"
    )
    keys = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.getcwd()}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        keys.add(out.stdout.strip())
    assert len(keys) == 1, keys


def test_negative_zero_is_the_same_configuration_as_zero():
    assert Configured(scale=-0.0).deployment_key() == Configured(scale=0.0).deployment_key()
    same = Configured(sampling=Sampling(temperature=-0.0), nested={"a": [{0}]})
    assert (
        same.deployment_key()
        == Configured(sampling=Sampling(temperature=0.0), nested={"a": [{0}]}).deployment_key()
    )
    assert Configured(scale=1.0).deployment_key() != Configured(scale=-1.0).deployment_key()


def test_different_configuration_still_gives_different_keys():
    assert (
        Configured(tags=frozenset("ab")).deployment_key()
        != Configured(tags=frozenset("abc")).deployment_key()
    )
    assert Configured(blob=b"a").deployment_key() != Configured(blob=b"b").deployment_key()


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("anything", threading.Lock(), "lock"),
        ("anything", lambda: 1, "function"),
        ("blob", b"\xff\xfe", "utf-8"),
    ],
)
def test_unserialisable_configuration_is_refused_when_built_naming_class_and_field(field, value, reason):
    with pytest.raises(TaskDefinitionError) as info:
        Configured(**{field: value})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"Configured.{field} cannot be serialised (")
    assert reason in message
    assert "plain data" in message  # says what to use instead


def test_gpus_written_or_defaulted_give_the_same_key_and_other_gpus_another():
    defaulted = Configured()
    assert defaulted.deployment_key() == Configured(gpus=1).deployment_key()
    assert defaulted.deployment_key() == Configured(gpus=1.0).deployment_key()
    assert defaulted.deployment_key() == Configured(gpus=None).deployment_key()
    assert Configured(gpus=0.5).deployment_key() != defaulted.deployment_key()
