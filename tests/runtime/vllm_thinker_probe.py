"""Run in the vLLM environment by `check_vllm_thinker` (tests/models/vllm_jobs.py): VLLMThinkerExecutor on
requests from a pickle.

argv: the pickle of `{"task": VLLMThinkerTask, "requests": [LLMInput (handles resolved)]}` and where to
write the results: per request, the generated token ids, each step's full log-probabilities, and what
`run` gives (its text and, for requests that ask for speech, the talker's conditioning items, and how
many text deltas had come when the first of them did, None if none came before the text ended); then the files
left in the executor's hidden-states directory once everything finished, an aborted request included.
"""

import asyncio
import os
import pickle
import sys
import time

from vllm_probe import tokens_and_logprobs, write


async def main(source: str, target: str) -> None:
    from prismserve.executors.vllm_thinker import VLLMThinkerExecutor

    with open(source, "rb") as f:
        job = pickle.load(f)
    executor = VLLMThinkerExecutor(job["task"])
    await executor.load()

    async def run(request):
        # Also how much text had come when the talker's first item did: it streams while the thinker
        # generates, so before the text ends.
        out = await executor.run(request)
        text, items, ahead = [], [], None
        async for delta in out.text:
            text.append(delta.text)
            if ahead is None and out.talker.snapshot(0)[0]:
                ahead = len(text)
        items = await out.talker.collect()
        return "".join(text), items, ahead

    async def aborted(request):
        # A speech request whose consumer goes away after the first token: vLLM aborts it.
        outputs = executor.outputs(
            request, extra_args={"kv_transfer_params": {"include_output_tokens": True}}
        )
        await anext(outputs)
        await outputs.aclose()

    try:
        requests = job["requests"]
        # All at once: requests that save hidden states and requests that do not share the batch.
        results = await asyncio.gather(
            *(tokens_and_logprobs(executor, r) for r in requests),
            *(run(r) for r in requests),
            aborted(requests[0].model_copy(update={"max_tokens": 64})),
        )
        deadline = time.monotonic() + 20
        while os.listdir(executor.states_dir) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # the engine removes an aborted request's lock file a step later
        left = sorted(os.listdir(executor.states_dir))
        n = len(requests)
        write(target, {"logprobs": results[:n], "runs": results[n : 2 * n], "left": left})
    finally:
        await executor.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
