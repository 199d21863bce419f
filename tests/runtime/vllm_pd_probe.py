"""Run in the vLLM environment by tests/models/test_vllm_llm.py: a prefill and a decode executor, each
its own engine, on requests from a pickle file, one after another.

argv: the pickle of `{"prefill": VLLMPrefillTask, "decode": VLLMDecodeTask, "requests": [LLMInput (handles
resolved)], "damaged": [indices of requests whose hand-off loses a file]}` and where to write the results: per request, the reply's text deltas, the hand-off
folders there were after prefill and which were taken after decode; and the folders left once the
executors' sweeps had run.
"""

import asyncio
import glob
import os
import pickle
import sys

from vllm_probe import write


def taken(folder: str) -> dict[str, bool]:
    """Each hand-off in `folder`, and whether a decode took it."""
    return {name: os.path.exists(os.path.join(folder, name, ".taken")) for name in os.listdir(folder)}


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
        for index, request in enumerate(job["requests"]):
            handoff = await prefill.run(request)
            saved = sorted(os.listdir(folder))
            if index in job.get("damaged", ()):  # one of the hand-off's files lost: decode computes it
                for name in os.listdir(folder):
                    layers = sorted(glob.glob(os.path.join(folder, name, "*.safetensors")))
                    if layers and not os.path.exists(os.path.join(folder, name, ".taken")):
                        os.remove(layers[-1])
            deltas = [d async for d in decode.stream(DecodeInput(**request.__dict__, handoff=handoff))]
            results.append({"deltas": deltas, "saved": saved, "taken": taken(folder)})
        await asyncio.sleep(job["decode"].handoff_grace_s * 2 + 1)  # the executors' sweeps run
        write(target, {"requests": results, "left": sorted(os.listdir(folder))})
    finally:
        await asyncio.gather(prefill.close(), decode.close())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
