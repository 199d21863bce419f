"""Run in the vLLM environment by tests/models/test_vllm_llm.py: a text request while a photo's
request is held in vLLM's multimodal processor.

argv: the pickle of `{"task": VLLMTask, "image": LLMInput, "text": LLMInput}` and where to write
the result: whether the text request was answered while the photo's processing was held, and the
tokens of each.
"""

import asyncio
import pickle
import sys
import threading

from vllm_probe import write


async def tokens(executor, request) -> list[int]:
    out = []
    async for delta in executor.generate(request):
        out += delta.token_ids
    return out


async def main(source: str, target: str) -> None:
    from prismserve.executors.vllm_llm import VLLMExecutor

    with open(source, "rb") as f:
        job = pickle.load(f)
    executor = VLLMExecutor(job["task"])
    await executor.load()
    renderer = executor.engine.renderer
    entered, release = threading.Event(), threading.Event()
    processor = renderer.get_mm_processor

    def held():  # the photo's processing waits here until the text request has had its chance
        entered.set()
        release.wait(120)
        return processor()

    renderer.get_mm_processor = held
    try:
        image = asyncio.ensure_future(tokens(executor, job["image"]))
        await asyncio.to_thread(entered.wait, 60)
        try:
            text = await asyncio.wait_for(tokens(executor, job["text"]), 20)
        except TimeoutError:
            text = None
        answered_while_held = text is not None and not image.done()
        release.set()
        write(target, {"answered_while_held": answered_while_held, "text": text, "image": await image})
    finally:
        release.set()
        await executor.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
