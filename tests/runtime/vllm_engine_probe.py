"""Run in the vLLM environment by tests/models/test_vllm_budgets.py: the scheduler settings of the engine
a `VLLMTask`'s executor starts.

argv: the pickle of `{"task": VLLMTask}` and where to write the engine's `max_num_batched_tokens`,
`enable_chunked_prefill` and `max_num_seqs`, and the text it generated for a short prompt.
"""

import pickle

from vllm_probe import write


async def main(source: str, target: str) -> None:
    from prismserve.executors.vllm_llm import VLLMExecutor
    from prismserve.task.components import LLMInput

    with open(source, "rb") as f:
        job = pickle.load(f)
    executor = VLLMExecutor(job["task"])
    await executor.load()
    try:
        config = executor.engine.vllm_config.scheduler_config
        request = LLMInput(conversation=[{"role": "user", "content": "hello"}], max_tokens=4)
        text = "".join([d.text async for d in executor.stream(request)])
        write(
            target,
            {
                "max_num_batched_tokens": config.max_num_batched_tokens,
                "enable_chunked_prefill": config.enable_chunked_prefill,
                "max_num_seqs": config.max_num_seqs,
                "text": text,
            },
        )
    finally:
        await executor.close()
