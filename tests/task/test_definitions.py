"""Task classes declared wrongly fail at definition or construction with a message that says why."""

from __future__ import annotations

import pytest
from toy.tasks import EncoderTask, MLLMTask, OmniTask

from prismserve.protocol.chat import ChatRequest
from prismserve.task import (
    DataHandle,
    RecordError,
    Stream,
    Task,
    TaskDefinitionError,
    TaskInput,
    TaskOutput,
    UnitTask,
)


class In(TaskInput):
    x: int


class Out(TaskOutput):
    y: int


def test_unit_task_invoke_is_final():
    with pytest.raises(TaskDefinitionError, match="overrides invoke\\(\\), which is final"):

        class Bad(UnitTask[In, Out]):
            executor_kind = "x"

            def invoke(self, task_input):
                return Out(y=1)


def test_invoke_must_be_synchronous():
    with pytest.raises(TaskDefinitionError, match="must be a plain `def`"):

        class Bad(Task[In, Out]):
            async def invoke(self, task_input):
                return Out(y=1)


def test_unit_output_must_be_task_output_or_stream():
    with pytest.raises(TaskDefinitionError, match="TaskOutput subclass or Stream"):

        class Bad(UnitTask[In, int]):
            executor_kind = "x"

    class Streams(UnitTask[In, Stream[int]]):
        executor_kind = "x"

    assert Streams().placeholder_output(3).id == "3"


def test_unit_task_without_kind_or_types_cannot_be_built():
    class NoKind(UnitTask[In, Out]):
        pass

    with pytest.raises(TaskDefinitionError, match="needs `executor_kind"):
        NoKind()

    class NoTypes(UnitTask):
        executor_kind = "x"

    with pytest.raises(TaskDefinitionError, match=r"class MyTask\(UnitTask\[MyInput, MyOutput\]\)"):
        NoTypes()


def test_unknown_config_fields_are_rejected():
    with pytest.raises(ValueError, match="modelid"):
        EncoderTask(modelid="m", modality="image")


def test_subtasks_are_discovered_in_attributes_and_nested_composites():
    omni = OmniTask(model_id="m")
    assert [type(t).__name__ for t in omni.subtasks()] == ["MLLMTask", "TalkerTask", "VocoderTask"]
    assert sorted(type(t).__name__ for t in omni.unit_tasks().values()) == [
        "EncoderTask",
        "EncoderTask",
        "LLMTask",
        "TalkerTask",
        "VocoderTask",
    ]
    assert len(MLLMTask(model_id="m", encoder_fission=False).unit_tasks()) == 1


def test_types_come_from_the_generic_parameters():
    assert EncoderTask.output_type.__name__ == "EncoderOutput"
    assert MLLMTask.input_type is ChatRequest


def test_data_handle_wraps_raw_values_and_guards_placeholders():
    class Holder(TaskOutput):
        h: DataHandle[list[int]]

    held = Holder(h=[1, 2])
    assert held.h.value == [1, 2] and not held.h.is_placeholder
    assert Holder.model_validate({"h": {"id": "7.h"}}).h.is_placeholder
    assert held.model_dump(mode="json") == {"h": {"id": held.h.id}}
    placeholder = DataHandle("0.x")
    for use in (bool, str, len, list, lambda h: h.value, lambda h: h[0]):
        with pytest.raises(RecordError, match="'0.x' was used while recording"):
            use(placeholder)


def test_resolved_handles_and_streams_still_compare_and_hash():
    one, same = DataHandle("v1", 1), DataHandle("v1", 1)
    assert one == same and {one, same} == {one} and one != DataHandle("v2", 1)
    stream, other = Stream("s"), Stream("s")
    assert stream == stream and stream != other and stream in {stream}  # noqa: PLR0124 - self-equality
    with pytest.raises(RecordError, match="'0.x' was compared while recording"):
        _ = one == DataHandle("0.x")
    with pytest.raises(RecordError, match=r"'1' was hashed \(put in a set"):
        hash(Stream("1", placeholder=True))


class OnOneDevice(UnitTask[In, Out]):
    executor_kind = "one-device"
    max_gpus = 1


class TwoByDefault(UnitTask[In, Out]):
    executor_kind = "two"
    default_gpus = 2


def test_gpus_default_from_the_class_and_take_shares_and_whole_numbers():
    assert EncoderTask(model_id="m", modality="image").gpus == 1
    assert TwoByDefault().gpus == 2
    assert TwoByDefault(gpus=None).gpus == 2  # None: the class's default (composites pass it down)
    for gpus in (0, 0.05, 0.5, 0.999, 1, 2, 8):
        assert EncoderTask(model_id="m", modality="image", gpus=gpus).gpus == gpus


@pytest.mark.parametrize("gpus", [-1, -0.5, 1.5, 2.25, float("nan"), float("inf")])
def test_a_gpus_value_that_is_neither_a_share_nor_whole_gpus_is_refused_naming_task_and_value(gpus):
    with pytest.raises(TaskDefinitionError, match=rf"EncoderTask: gpus={gpus:g} is not a GPU shape"):
        EncoderTask(model_id="m", modality="image", gpus=gpus)


def test_a_task_on_one_device_refuses_several_gpus_and_names_vllm_for_tensor_parallelism():
    assert OnOneDevice(gpus=1).gpus == 1 and OnOneDevice(gpus=0.25).gpus == 0.25
    with pytest.raises(TaskDefinitionError, match=r"OnOneDevice: gpus=2, .* at most 1 GPU.*vLLM stages"):
        OnOneDevice(gpus=2)
