"""Qwen-Image split at the text encoder: the generator fed with the prompt's conditioning paints the
whole pipeline's pixels; served through `/v1/images/generations` with the `openai` client."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image
from toy.executors import EXECUTORS

from prismserve.executors.loading import InProcessExecutors
from prismserve.gateway import create_gateway
from prismserve.models import adapter_for
from prismserve.protocol.images import ImageRequest
from prismserve.runtime import LocalRuntime
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import use_dispatcher
from prismserve.tasklib.imagegen import ImageGenTask
from prismserve.tasklib.units import ImageGeneratorTask, TextEncoderTask

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CLASSES = {TextEncoderTask, ImageGeneratorTask}
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen_image.py"


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)))


@pytest.fixture(scope="module")
def parts(tiny_image):
    encoder, generator, whole = (adapter_for(tiny_image) for _ in range(3))
    encoder.load_text_encoder()
    generator.load_generator()
    whole.load_monolith()
    return encoder, generator, whole


def test_split_pipeline_paints_the_whole_pipelines_pixels(parts):
    encoder, generator, whole = parts
    shape = {"width": 64, "height": 48, "steps": 4, "guidance": 4.0}
    embeds, negative = encoder.encode_prompt("a red car on a street"), encoder.encode_prompt("blurry")
    split = generator.generate(embeds=embeds, negative=negative, seed=11, **shape)
    monolith = whole.generate("a red car on a street", negative_prompt="blurry", seed=11, **shape)
    assert pixels(split).shape == (48, 64, 3)
    assert np.array_equal(pixels(split), pixels(monolith))
    assert not np.array_equal(
        pixels(split), pixels(generator.generate(embeds=embeds, negative=negative, seed=12, **shape))
    )
    # Guidance is on: without the negative conditioning the image differs.
    assert not np.array_equal(pixels(split), pixels(generator.generate(embeds=embeds, seed=11, **shape)))


def test_concurrent_prompts_and_paintings_batch_each_as_alone(parts, tiny_image):
    """Prompts of different lengths encode in one batch, and paintings of one size, step count and
    guidance (conditionings of different lengths, padded and masked; or prompts) paint in one
    pipeline call, each as it is alone, from its own seed; the executor paints a mixed batch kind by
    kind, each caller getting its own image."""
    from prismserve.executors.image import ImageGeneratorExecutor
    from prismserve.models.base import ThreadBatcher
    from prismserve.models.qwen_image import Painting

    encoder, generator, whole = parts
    prompts = ["a red car on a street at night with lights", "blurry", "two cats"]
    batched = encoder.encode_prompts(prompts)
    assert len({len(e) for e in batched}) == 3  # three lengths: padded in the batch
    for prompt, embeds in zip(prompts, batched, strict=True):
        np.testing.assert_allclose(embeds, encoder.encode_prompt(prompt), atol=1e-5, rtol=0)
    shape = {"width": 32, "height": 32, "steps": 3, "guidance": 4.0}
    negative = batched[1]
    split = [Painting(embeds=batched[i], negative=negative, seed=i, **shape) for i in (0, 2)]
    together = generator.paint(split)
    for painting, image in zip(split, together, strict=True):
        alone = generator.generate(embeds=painting.embeds, negative=negative, seed=painting.seed, **shape)
        assert np.abs(pixels(image).astype(int) - pixels(alone)).max() <= 1
    assert not np.array_equal(pixels(together[0]), pixels(together[1]))
    monolith = [Painting(prompt=prompts[i], negative_prompt="blurry", seed=i, **shape) for i in (0, 2)]
    for painting, image in zip(monolith, whole.paint(monolith), strict=True):
        alone = whole.generate(painting.prompt, negative_prompt="blurry", seed=painting.seed, **shape)
        assert np.abs(pixels(image).astype(int) - pixels(alone)).max() <= 1

    async def mixed() -> list[bytes]:
        executor = ImageGeneratorExecutor(ImageGeneratorTask(model=tiny_image))
        executor.adapter = generator
        executor.painter = ThreadBatcher(lambda kind, batch: generator.paint(batch), executor.max_batch)
        other = {**shape, "width": 48}
        paintings = [split[0], Painting(embeds=batched[2], seed=5, **other), split[1]]
        return await asyncio.gather(*(asyncio.to_thread(executor.painter, p.kind, p) for p in paintings))

    images = asyncio.run(mixed())
    assert [pixels(p).shape for p in images] == [(32, 32, 3), (32, 48, 3), (32, 32, 3)]
    assert np.abs(pixels(images[2]).astype(int) - pixels(together[1])).max() <= 1


def generate(
    executors: InProcessExecutors, task: ImageGenTask, request: ImageRequest
) -> tuple[list[bytes], list]:
    graphs = []

    async def go() -> list[bytes]:
        with use_dispatcher(LocalDispatcher(executors.callables(CLASSES), on_graph=graphs.append)):
            return [await h.fetch() for h in (await task(request)).images]

    return asyncio.run(go()), graphs


def test_image_gen_task_split_and_whole_agree(tiny_image):
    executors = InProcessExecutors()
    request = ImageRequest(
        prompt="two cars", negative_prompt="rain", n=2, width=32, height=32, steps=3, seed=5
    )
    split, graphs = generate(executors, ImageGenTask(model=tiny_image), request)
    whole, whole_graphs = generate(
        executors, ImageGenTask(model=tiny_image, text_encoder_fission=False), request
    )
    assert [n.executor_kind for n in graphs[0].nodes] == [
        "mm-text-encoder",
        "mm-text-encoder",
        "mm-image",
        "mm-image",
    ]
    assert [n.executor_kind for n in whole_graphs[0].nodes] == ["mm-image", "mm-image"]
    assert [pixels(p).tolist() for p in split] == [pixels(p).tolist() for p in whole]
    assert not np.array_equal(pixels(split[0]), pixels(split[1]))  # seeds 5 and 6
    # Without a seed, one is drawn per request: the same on record and replay, different across requests.
    unseeded = request.model_copy(update={"seed": None, "n": 1})
    first, _ = generate(executors, ImageGenTask(model=tiny_image), unseeded)
    second, _ = generate(executors, ImageGenTask(model=tiny_image), unseeded)
    assert not np.array_equal(pixels(first[0]), pixels(second[0]))


@pytest.fixture(scope="module")
def gateway(tiny_image, serve_gateway):
    # The image tasks on their real executors (no function for their kinds), the chat app on the toy ones.
    runtime = LocalRuntime(EXECUTORS)
    app = create_gateway(runtime, admin_token="t")
    with serve_gateway(app) as url:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("PRISMSERVE_MODEL", tiny_image)
            asyncio.run(runtime.register_app(EXAMPLE.read_text(), "qwen-image"))
        asyncio.run(runtime.register_app("from toy.mllm_app import *", "chat"))
        yield url, tiny_image


def test_images_endpoint_answers_the_openai_client(gateway):
    url, model = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    result = client.images.generate(model="qwen-image", prompt="a red car", size="64x32", n=2, response_format="b64_json",
                                    extra_body={"seed": 3, "num_inference_steps": 3})  # fmt: skip
    images = [base64.b64decode(d.b64_json) for d in result.data]
    assert [pixels(p).shape for p in images] == [(32, 64, 3), (32, 64, 3)]
    request = ImageRequest(prompt="a red car", width=64, height=32, n=2, steps=3, seed=3)
    expected, _ = generate(
        InProcessExecutors(), ImageGenTask(model=model, text_encoder_fission=False), request
    )
    assert [pixels(p).tolist() for p in images] == [pixels(p).tolist() for p in expected]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "qwen-image", "prompt": "x", "size": "60x60"}, "multiples of 16"),
        ({"model": "qwen-image", "prompt": "x", "size": "large"}, "size must be WIDTHxHEIGHT"),
        ({"model": "qwen-image", "prompt": "x", "response_format": "url"}, "no image store"),
        ({"model": "qwen-image", "prompt": "x", "n": 9}, "less than or equal to 4"),
        ({"model": "chat", "prompt": "x"}, "does not generate images"),
    ],
)
def test_images_endpoint_refuses_what_it_cannot_serve(gateway, body, message):
    import httpx

    url, _ = gateway
    response = httpx.post(f"{url}/v1/images/generations", json=body, timeout=60)
    assert response.status_code == 400 and message in response.text, response.text
