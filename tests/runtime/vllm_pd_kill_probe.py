"""Run in the vLLM environment by tests/models/test_vllm_llm.py: one prefill and two decode executors;
one decode engine is killed while it streams a reply. argv as `vllm_pd_probe.py`'s, the job's two
requests going one to each decode (the second to the one killed).

Writes: the reply of the decode that lived, the error of the one killed, the hand-off folders left
after both (and whether taken), and those left once the TTL had passed.
"""

import asyncio
import os
import pickle
import signal
import sys

import psutil
from vllm_pd_probe import taken
from vllm_probe import write


async def main(source: str, target: str) -> None:
    from prismserve.executors.vllm_llm import VLLMDecodeExecutor, VLLMPrefillExecutor
    from prismserve.tasklib.units import DecodeInput

    with open(source, "rb") as f:
        job = pickle.load(f)
    (kept, lost), folder = job["requests"], job["prefill"].handoff_dir
    prefill, survivor = VLLMPrefillExecutor(job["prefill"]), VLLMDecodeExecutor(job["decode"])
    await asyncio.gather(prefill.load(), survivor.load())
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    victim = VLLMDecodeExecutor(job["decode"])
    await victim.load()
    engine = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    try:

        async def decode(executor, request, kill: bool):
            handoff = await prefill.run(request)
            deltas = []
            try:
                async for delta in executor.stream(DecodeInput(**request.__dict__, handoff=handoff)):
                    deltas.append(delta)
                    if kill and len(deltas) == 3:
                        for process in engine:
                            os.kill(process.pid, signal.SIGKILL)
            except Exception as exc:  # noqa: BLE001 - what the replica's caller would get
                return exc
            return deltas

        lived, killed = await asyncio.gather(decode(survivor, kept, False), decode(victim, lost, True))
        left = taken(folder)
        settings = job["prefill"]
        await asyncio.sleep(settings.handoff_ttl_s + settings.handoff_grace_s + 1)  # the sweeps run
        swept = sorted(os.listdir(folder))
        write(target, {"lived": lived, "killed": repr(killed), "left": left, "swept": swept})
    finally:
        await asyncio.gather(prefill.close(), survivor.close())
        await victim.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
