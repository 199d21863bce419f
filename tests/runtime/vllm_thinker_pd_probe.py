"""Run in the vLLM environment by `check_vllm_thinker_prefill_decode` (tests/models/vllm_jobs.py): an Omni
thinker's prefill and decode executors, each its own engine, on requests from a pickle, all at once.

argv: the pickle of `{"prefill": VLLMThinkerPrefillTask, "decode": VLLMThinkerDecodeTask, "requests":
[LLMInput (handles resolved)]}` and where to write the results: per request, the reply's text deltas
and the talker's conditioning items; the hand-off folders once all were answered, each with whether a
decode took it; then the hand-off folders and hidden-states files left once the executors' sweeps had run.
"""

import asyncio
import os
import pickle
import sys

from vllm_probe import write


async def main(source: str, target: str) -> None:
    from prismserve.executors.vllm_thinker import VLLMThinkerDecodeExecutor, VLLMThinkerPrefillExecutor
    from prismserve.tasklib.units import DecodeInput

    with open(source, "rb") as f:
        job = pickle.load(f)
    prefill, decode = VLLMThinkerPrefillExecutor(job["prefill"]), VLLMThinkerDecodeExecutor(job["decode"])
    await asyncio.gather(prefill.load(), decode.load())

    async def run(request):
        handoff = await prefill.run(request)
        out = await decode.run(DecodeInput(**request.__dict__, handoff=handoff))
        return [d async for d in out.text], await out.talker.collect()

    try:
        results = await asyncio.gather(*(run(r) for r in job["requests"]))
        folder = job["prefill"].handoff_dir
        taken = {name: os.path.exists(os.path.join(folder, name, ".taken")) for name in os.listdir(folder)}
        await asyncio.sleep(job["decode"].handoff_grace_s * 2 + 1)  # the executors' sweeps run
        left = sorted(os.listdir(job["prefill"].handoff_dir))
        states = sorted(os.listdir(decode.states_dir)) + sorted(os.listdir(prefill.states_dir))
        write(target, {"runs": results, "taken": taken, "left": left, "states": states})
    finally:
        await asyncio.gather(prefill.close(), decode.close())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
