"""GPU shapes of the task library's deployments: one device for transformers and diffusers tasks,
tensor parallelism for vLLM stages."""

from __future__ import annotations

import pytest

from prismserve.runtime.ray_runtime import default_cells
from prismserve.task import TaskDefinitionError
from prismserve.tasklib import MLLMTask, OmniTask
from prismserve.tasklib.imagegen import ImageGenTask
from prismserve.tasklib.units import (
    EncoderTask,
    ImageGeneratorTask,
    LLMTask,
    TalkerTask,
    TextEncoderTask,
    ThinkerTask,
    VLLMTask,
    VLLMThinkerTask,
    VocoderTask,
)

ONE_DEVICE = [
    lambda g: EncoderTask(model="m", modality="image", gpus=g),
    lambda g: LLMTask(model="m", gpus=g),
    lambda g: ThinkerTask(model="m", gpus=g),
    lambda g: TalkerTask(model="m", gpus=g),
    lambda g: VocoderTask(model="m", gpus=g),
    lambda g: TextEncoderTask(model="m", gpus=g),
    lambda g: ImageGeneratorTask(model="m", gpus=g),
]


@pytest.mark.parametrize("build", ONE_DEVICE)
def test_transformers_and_diffusers_tasks_take_a_share_or_one_gpu_and_point_to_vllm_for_more(build):
    assert build(0.3).gpus == 0.3 and build(1).gpus == 1
    with pytest.raises(TaskDefinitionError, match=r"gpus=2, .*tensor parallelism .* \(engine=\"vllm\"\)"):
        build(2)


def test_vllm_stages_take_several_whole_gpus():
    assert VLLMTask(model="m", gpus=4).gpus == 4
    assert VLLMThinkerTask(model="m", gpus=2).gpus == 2
    with pytest.raises(TaskDefinitionError, match=r"VLLMTask: gpus=2.5 is not a GPU shape"):
        VLLMTask(model="m", gpus=2.5)


# The layouts docs/models.md gives for a split Qwen2.5-Omni (shares leave room for CUDA contexts).
ONE_GPU = {"image": 0.07, "audio": 0.07, "thinker": 0.4, "talker": 0.25, "vocoder": 0.15}
TWO_GPUS = {"thinker": 0.75, "image": 0.1, "audio": 0.1, "talker": 0.65, "vocoder": 0.3}


def _shapes(task) -> dict[str, float]:
    return {path: unit.gpus for path, unit in task.named_unit_tasks().items()}


def _cells(task) -> list[list[str]]:
    """The cells a runtime gives the app's deployments before any plan, by unit-task path."""
    paths = {unit.deployment_key(): path for path, unit in task.named_unit_tasks().items()}
    shapes = {unit.deployment_key(): unit.gpus for unit in task.named_unit_tasks().values()}
    return sorted(sorted(paths[k] for k in cell.replicas) for cell in default_cells(shapes))


def test_omni_hands_each_component_its_gpus_and_the_documented_layouts_fit_one_and_two_gpus():
    one = OmniTask(model="m", gpus=ONE_GPU)
    assert _shapes(one) == {
        "encoders.image": 0.07,
        "encoders.audio": 0.07,
        "thinker": 0.4,
        "talker": 0.25,
        "vocoder": 0.15,
    }
    assert _cells(one) == [["encoders.audio", "encoders.image", "talker", "thinker", "vocoder"]]
    assert _cells(OmniTask(model="m", gpus=TWO_GPUS)) == [
        ["encoders.audio", "encoders.image", "thinker"],
        ["talker", "vocoder"],
    ]
    assert _shapes(OmniTask(model="m", gpus={"talker": 0.5}))["thinker"] == 1  # the rest: defaults
    tensor_parallel = OmniTask(
        model="m", engine="vllm", gpus={"thinker": 2, "image": 0.2, "talker": 0.5, "vocoder": 0.25}
    )
    assert _cells(tensor_parallel) == [["encoders.image", "talker", "vocoder"], ["thinker"]]


def test_omni_on_vllm_takes_tensor_parallelism_and_no_audio_encoder_share():
    omni = OmniTask(model="m", engine="vllm", gpus={"thinker": 2, "image": 0.2})
    assert _shapes(omni) == {"encoders.image": 0.2, "thinker": 2, "talker": 1, "vocoder": 1}
    with pytest.raises(TaskDefinitionError, match=r"gpus names 'audio', not a component it deploys; "
                       r"its components are 'image', 'thinker', 'talker', 'vocoder'"):  # fmt: skip
        OmniTask(model="m", engine="vllm", gpus={"audio": 0.1})
    with pytest.raises(TaskDefinitionError, match=r"ThinkerTask: gpus=2, .*vLLM stages"):
        OmniTask(model="m", gpus={"thinker": 2})


def test_the_omni_monolith_takes_whole_only():
    assert _shapes(OmniTask(model="m", monolith=True, gpus={"whole": 0.5})) == {"whole": 0.5}
    with pytest.raises(
        TaskDefinitionError, match=r"OmniTask\(monolith=True\): gpus names 'thinker'.*'whole'"
    ):
        OmniTask(model="m", monolith=True, gpus={"thinker": 0.5})


def test_mllm_and_image_generation_hand_their_components_their_gpus():
    mllm = MLLMTask(model="m", modalities=("image", "video"), engine="vllm", gpus={"video": 0.3, "llm": 2})
    assert _shapes(mllm) == {"encoders.image": 1, "encoders.video": 0.3, "llm": 2}
    with pytest.raises(TaskDefinitionError, match=r"gpus names 'image', .* its components are 'llm'"):
        MLLMTask(model="m", encoder_fission=False, gpus={"image": 0.2})
    images = ImageGenTask(model="m", gpus={"text_encoder": 0.3, "generator": 0.7})
    assert _shapes(images) == {"text_encoder": 0.3, "generator": 0.7}
    with pytest.raises(TaskDefinitionError, match=r"gpus names 'text_encoder', .*'generator'"):
        ImageGenTask(model="m", text_encoder_fission=False, gpus={"text_encoder": 0.3})
