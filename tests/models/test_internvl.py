"""InternVL3 split at the vision encoder (tiles -> InternViT -> pixel shuffle -> projector), and two
LLMs sharing one encoder (002 Listing 2)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from prismserve.app import AppRegistry, load_app_source
from prismserve.executors.loading import InProcessExecutors
from prismserve.models import MediaInput, adapter_for
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import use_dispatcher
from prismserve.tasklib import EncoderTask, LLMTask, MLLMTask, conversation, reply_text

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shared_encoder.py"


def square_png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (50, 50), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_fissioned_logits_equal_the_monoliths(tiny_internvl, cars_jpg):
    encoder, llm, monolith = (adapter_for(tiny_internvl) for _ in range(3))
    encoder.load_encoder("image")
    llm.load_llm(with_encoders=False)
    monolith.load_llm(with_encoders=True)
    request = ChatRequest.of("Compare the two pictures.", images=[cars_jpg, square_png()])
    messages, media = conversation(request)
    encoded = encoder.encode("image", [m.data for m in media])
    # cars.jpg is wide: tiles and a thumbnail; the square image one tile. Each tile: image_seq_length embeddings.
    assert (
        encoded[0].embeddings.shape[0] > encoded[1].embeddings.shape[0]
        and encoded[0].embeddings.shape[1] == 4
    )
    fissioned = llm.generate(llm.llm_inputs(messages, encoded=encoded), 10, with_logits=True)
    whole = monolith.generate(
        monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media]),
        10,
        with_logits=True,
    )
    assert fissioned.token_ids == whole.token_ids
    np.testing.assert_allclose(fissioned.logits, whole.logits, atol=1e-4, rtol=0)
    assert not hasattr(llm.model.model, "vision_tower") and not hasattr(encoder.model, "language_model")


def run(app_source: str, request: ChatRequest, graphs: list) -> dict:
    executors = InProcessExecutors()

    async def go():
        app = load_app_source(app_source, "pair", "<shared encoder>")
        AppRegistry().register(app)
        with use_dispatcher(
            LocalDispatcher(executors.callables({EncoderTask, LLMTask}), on_graph=graphs.append)
        ):
            return (await app.serve(request)).answers, app

    return asyncio.run(go())


def test_two_llms_share_one_encoder_call_per_image(tiny_internvl, cars_jpg, monkeypatch):
    from prismserve.models import tiny

    tuned = str(tiny.build("internvl3-tuned"))
    monkeypatch.setenv("PRISMSERVE_MODEL", tiny_internvl)
    monkeypatch.setenv("PRISMSERVE_MODEL_TUNED", tuned)
    request = ChatRequest.of("What is in the picture?", images=[cars_jpg], max_tokens=8)
    graphs: list = []
    answers, app = run(EXAMPLE.read_text(), request, graphs)
    assert [n.executor_kind for n in graphs[0].nodes] == ["mm-encoder", "mm-llm", "mm-llm"]
    assert len(app.unit_tasks()) == 3  # one encoder deployment, two LLMs

    async def alone(model: str) -> str:
        executors = InProcessExecutors()
        with use_dispatcher(LocalDispatcher(executors.callables({EncoderTask, LLMTask}))):
            return await reply_text((await MLLMTask(model=model, encoder_fission=False)(request)).text)

    assert answers == {"base": asyncio.run(alone(tiny_internvl)), "tuned": asyncio.run(alone(tuned))}
    assert answers["base"] != answers["tuned"]  # two different LLMs
