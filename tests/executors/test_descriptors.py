"""Every unit task that names an executor names one that runs it: the descriptor resolves to an
Executor whose settings, input and output types fit the task's; a wrong one is refused on load."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest

import prismserve.emulate
import prismserve.tasklib
from prismserve.executors.base import Executor
from prismserve.executors.loading import load_executor_class
from prismserve.protocol.chat import TextDelta
from prismserve.task import ExecutorRef, Stream, TaskDefinitionError, UnitTask
from prismserve.task.components import LLMInput, MediaItem, ModelSettings, PromptEmbeddings, PromptInput


def _package_unit_tasks() -> list[type[UnitTask[Any, Any]]]:
    """Every unit task class defined in the task library and the emulated models."""
    for package in (prismserve.tasklib, prismserve.emulate):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)
    found, stack = [], list(UnitTask.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        defined_in_package = cls.__module__.startswith(("prismserve.tasklib.", "prismserve.emulate."))
        if defined_in_package and cls.__pydantic_generic_metadata__["origin"] is None:
            found.append(cls)
    return sorted(set(found), key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


TASKS = _package_unit_tasks()
NAMING = [cls for cls in TASKS if cls.executor_ref is not None]


def test_the_walk_finds_the_task_librarys_components_and_the_emulated_stages():
    names = {cls.__qualname__ for cls in NAMING}
    assert {"EncoderTask", "LLMTask", "VLLMTask", "ThinkerTask", "VLLMThinkerTask", "TalkerTask"} <= names
    assert {"VocoderTask", "OmniMonolithTask", "TextEncoderTask", "ImageGeneratorTask"} <= names
    assert "Stage" in {cls.__qualname__ for cls in TASKS} - names  # sim only: it names none


@pytest.mark.parametrize("task_class", NAMING, ids=lambda cls: cls.__qualname__)
def test_each_unit_tasks_executor_resolves_and_takes_its_settings_input_and_output(task_class):
    executor = task_class.executor_ref.resolve()
    assert isinstance(executor, type) and issubclass(executor, Executor)
    assert issubclass(task_class, executor.settings_type)  # the task has every field the executor reads
    assert issubclass(task_class.input_type, executor.input_type)
    output = executor.output_type
    assert output == task_class.output_type or issubclass(output, task_class.output_type)
    assert load_executor_class(task_class) is executor


def test_only_vllm_stages_run_in_an_environment_of_their_own():
    envs = {cls.__qualname__: cls.executor_ref.env for cls in NAMING if cls.executor_ref.env}
    vllm = ["VLLMTask", "VLLMThinkerTask", "VLLMPrefillTask", "VLLMDecodeTask"]
    assert envs == dict.fromkeys([*vllm, "VLLMThinkerPrefillTask", "VLLMThinkerDecodeTask"], "vllm")


class PromptEncoder(Executor[ModelSettings, PromptInput, PromptEmbeddings]):
    """An executor of prompts, to be named by a task of another input type."""


class Misnamed(UnitTask[MediaItem, PromptEmbeddings], ModelSettings):
    executor_kind = "misnamed"
    executor_ref = ExecutorRef(f"{__name__}:PromptEncoder")


class NoSettings(UnitTask[PromptInput, PromptEmbeddings]):
    executor_kind = "no-settings"
    executor_ref = ExecutorRef(f"{__name__}:PromptEncoder")


class WrongOutput(UnitTask[PromptInput, Stream[TextDelta]], ModelSettings):
    executor_kind = "wrong-output"
    executor_ref = ExecutorRef(f"{__name__}:PromptEncoder")


class NotAnExecutor(UnitTask[LLMInput, Stream[TextDelta]], ModelSettings):
    executor_kind = "not-an-executor"
    executor_ref = ExecutorRef(f"{__name__}:Misnamed")


@pytest.mark.parametrize(
    ("task_class", "message"),
    [
        (Misnamed, "PromptEncoder serves PromptInput, not the task's input type"),
        (NoSettings, "the task is not a ModelSettings"),
        (WrongOutput, "not the task's output type"),
        (NotAnExecutor, "not an Executor class: name a subclass of prismserve.executors.base.Executor"),
    ],
    ids=lambda value: value.__qualname__ if isinstance(value, type) else "",
)
def test_an_executor_that_does_not_fit_its_task_is_refused_on_load_saying_why(task_class, message):
    with pytest.raises(ValueError, match=message):
        load_executor_class(task_class)


def test_a_descriptor_names_a_module_and_a_class_or_says_how_to_write_it():
    with pytest.raises(TaskDefinitionError, match="'package.module:ClassName'"):
        ExecutorRef("prismserve.executors.encoder.EncoderExecutor")
    with pytest.raises(TaskDefinitionError, match="cannot be imported .*correct the module path"):
        ExecutorRef("prismserve.executors.no_such_module:Executor").resolve()
    with pytest.raises(TaskDefinitionError, match="defines no class NoSuchExecutor"):
        ExecutorRef("prismserve.executors.encoder:NoSuchExecutor").resolve()


def test_the_retired_executor_class_and_env_are_refused_naming_executor_ref():
    with pytest.raises(
        TaskDefinitionError, match="sets executor_class and executor_env, which `executor_ref`"
    ):

        class Old(UnitTask[PromptInput, PromptEmbeddings], ModelSettings):
            executor_kind = "old"
            executor_class = "prismserve.executors.image:TextEncoderExecutor"
            executor_env = "vllm"
