"""Run in the vLLM environment by tests/models/test_vllm_llm.py: VLLMExecutor on requests from a pickle file.

argv: the pickle of `{"task": VLLMTask, "requests": [LLMInput (handles resolved)]}` and where to
write the results: per request, the generated token ids and each step's full log-probabilities.
"""

import asyncio
import os
import pickle
import sys

import numpy as np


async def tokens_and_logprobs(executor, request) -> tuple[list[int], np.ndarray]:
    """The token ids `executor` generates for `request` and each step's full log-probabilities
    (`[steps, vocab]`, -inf where vLLM reports none)."""
    vocab = len(executor.tokenizer)
    tokens, steps = [], []
    async for delta in executor.generate(request, logprobs=True):
        tokens += delta.token_ids
        for logprobs in delta.logprobs or []:
            step = np.full(vocab, -np.inf)
            for token, entry in logprobs.items():
                if token < vocab:
                    step[token] = entry.logprob
            steps.append(step)
    return tokens, np.stack(steps)


def write(target: str, results: object) -> None:
    """Pickle `results` to `target` whole: a reader waiting for the file never sees half of it."""
    with open(target + ".part", "wb") as f:
        pickle.dump(results, f)
    os.replace(target + ".part", target)


async def main(source: str, target: str) -> None:
    from prismserve.executors.vllm_llm import VLLMExecutor

    with open(source, "rb") as f:
        job = pickle.load(f)
    executor = VLLMExecutor(job["task"])
    await executor.load()
    try:  # concurrently: batched
        results = await asyncio.gather(*(tokens_and_logprobs(executor, r) for r in job["requests"]))
        write(target, results)  # before the engine's shutdown, which takes seconds
    finally:
        await executor.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
