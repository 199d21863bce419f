"""vLLM's engine arguments follow the deployment's GPUs: whole GPUs are tensor parallelism, a share
of one GPU is the memory vLLM may take; the task's engine_args still win. No engine is started."""

from __future__ import annotations

from prismserve.executors.vllm_llm import VLLMExecutor, engine_settings
from prismserve.tasklib.units import VLLMTask, VLLMThinkerTask

BASE = {
    "model": "m",
    "dtype": "auto",
    "max_model_len": 4096,
    "enable_mm_embeds": True,
    "enable_prefix_caching": True,
    "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True},
}


def test_whole_gpus_on_cuda_are_tensor_parallelism_in_vllms_own_worker_processes():
    assert engine_settings(VLLMTask(model="m"), cuda=True) == {
        **BASE,
        "enforce_eager": False,
        "tensor_parallel_size": 1,
    }
    assert engine_settings(VLLMThinkerTask(model="m", gpus=4), cuda=True) == {
        **BASE,
        "enforce_eager": False,
        "tensor_parallel_size": 4,
        "distributed_executor_backend": "mp",
    }


def test_a_share_of_a_gpu_is_the_memory_vllm_may_take():
    settings = engine_settings(VLLMThinkerTask(model="m", gpus=0.32), cuda=True)
    assert settings == {**BASE, "enforce_eager": False, "gpu_memory_utilization": 0.32}


def test_on_the_cpu_declared_gpus_shape_nothing():
    for gpus in (0.5, 1, 2):
        assert engine_settings(VLLMTask(model="m", gpus=gpus), cuda=False) == {**BASE, "enforce_eager": True}


def test_the_tasks_engine_args_override_the_computed_settings():
    import torch

    task = VLLMTask(model="m", gpus=0.5, engine_args={"enforce_eager": False, "max_model_len": 64})
    computed = engine_settings(task, cuda=torch.cuda.is_available())
    assert VLLMExecutor(task).engine_arguments() == {**computed, "enforce_eager": False, "max_model_len": 64}


def test_auto_is_the_checkpoints_dtype_not_vllms(tmp_path):
    """vLLM's own `auto` would run the float32 tiny checkpoints in bfloat16 on the CPU, unlike the
    transformers engine and the encoders and talker beside it: `auto` is the checkpoint's dtype."""
    from prismserve.models import tiny

    for model in (tiny.build("qwen2.5-omni"), tiny.build("qwen2.5-vl")):
        assert engine_settings(VLLMThinkerTask(model=str(model)), cuda=False)["dtype"] == "float32"
        assert (
            engine_settings(VLLMTask(model=str(model), dtype="bfloat16"), cuda=False)["dtype"] == "bfloat16"
        )
    (tmp_path / "config.json").write_text('{"model_type": "qwen2", "torch_dtype": "bfloat16"}')
    assert engine_settings(VLLMTask(model=str(tmp_path)), cuda=False)["dtype"] == "bfloat16"
    assert engine_settings(VLLMTask(model=str(tmp_path / "absent")), cuda=False)["dtype"] == "auto"


def test_quantization_is_passed_when_given_and_left_to_the_checkpoint_otherwise():
    assert "quantization" not in engine_settings(VLLMTask(model="m"), cuda=False)  # vLLM reads the config
    task = VLLMTask(model="m", quantization="compressed-tensors")
    assert engine_settings(task, cuda=False)["quantization"] == "compressed-tensors"
