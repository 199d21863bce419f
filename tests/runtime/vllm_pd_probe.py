"""Run in the vLLM environment by tests/models/test_vllm_llm.py: a prefill and a decode executor, each
its own engine, on requests from a pickle file, one after another.

argv: the pickle of `{"prefill": VLLMPrefillTask, "decode": VLLMDecodeTask, "requests": [LLMInput (handles
resolved)]}` and where to write the results: per request, the reply's text deltas and the hand-off
folders there were after prefill and after decode.
"""

import asyncio
import os
import pickle
import sys

from vllm_probe import write


async def main(source: str, target: str) -> None:
    from prismserve.executors.vllm_llm import VLLMDecodeExecutor, VLLMPrefillExecutor
    from prismserve.tasklib.units import DecodeInput

    with open(source, "rb") as f:
        job = pickle.load(f)
    prefill, decode = VLLMPrefillExecutor(job["prefill"]), VLLMDecodeExecutor(job["decode"])
    folder = job["prefill"].handoff_dir
    await asyncio.gather(prefill.load(), decode.load())
    try:
        results = []
        for request in job["requests"]:
            handoff = await prefill.run(request)
            saved = sorted(os.listdir(folder))
            deltas = [d async for d in decode.stream(DecodeInput(**request.__dict__, handoff=handoff))]
            results.append({"deltas": deltas, "saved": saved, "left": sorted(os.listdir(folder))})
        write(target, results)
    finally:
        await asyncio.gather(prefill.close(), decode.close())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
