"""Gemma 3 split at the vision encoder (SigLIP + pooling projector): the fissioned LLM computes the
monolith's logits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from prismserve.executors.loading import InProcessExecutors
from prismserve.models import MediaInput, adapter_for
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import use_dispatcher
from prismserve.tasklib import EncoderTask, LLMTask, MLLMTask, conversation, reply_text

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_fissioned_logits_equal_the_monoliths(tiny_gemma3, cars_jpg, small_png):
    encoder, llm, monolith = (adapter_for(tiny_gemma3) for _ in range(3))
    encoder.load_encoder("image")
    llm.load_llm(with_encoders=False)
    monolith.load_llm(with_encoders=True)
    messages, media = conversation(ChatRequest.of("Compare the two pictures.", images=[cars_jpg, small_png]))
    encoded = encoder.encode("image", [m.data for m in media])
    assert [e.embeddings.shape for e in encoded] == [(4, 64), (4, 64)]  # mm_tokens_per_image each
    inputs = llm.llm_inputs(messages, encoded=encoded)
    fissioned = llm.generate(inputs, 10, with_logits=True)
    whole = monolith.generate(
        monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media]),
        10,
        with_logits=True,
    )
    assert fissioned.token_ids == whole.token_ids
    np.testing.assert_allclose(fissioned.logits, whole.logits, atol=1e-4, rtol=0)
    # The embeddings' order matters: swapped, other logits (they are placed, not pooled).
    swapped = llm.generate(llm.llm_inputs(messages, encoded=encoded[::-1]), 1, with_logits=True)
    assert np.abs(swapped.logits[0] - whole.logits[0]).max() > 1e-4


def test_mllm_task_fissioned_and_monolithic_stream_the_same_text(tiny_gemma3, cars_jpg):
    request = ChatRequest.of("What is in the picture?", images=[cars_jpg], max_tokens=8)

    async def text(fission: bool) -> str:
        with use_dispatcher(LocalDispatcher(InProcessExecutors().callables({EncoderTask, LLMTask}))):
            return await reply_text(
                (await MLLMTask(model=tiny_gemma3, encoder_fission=fission)(request)).text
            )

    split, whole = asyncio.run(text(True)), asyncio.run(text(False))
    # Equal, and not because both are empty: 8 tokens make at least two words and 8 characters.
    assert split == whole and len(whole.split()) >= 2 and len(whole) >= 8, (split, whole)
