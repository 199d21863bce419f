"""GPU shapes of the task library's deployments: one device for transformers and diffusers tasks,
tensor parallelism for vLLM stages."""

from __future__ import annotations

import pytest

from prismserve.task import TaskDefinitionError
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
