"""The LLMs of the vision-language families on vLLM (in its own environment, as replicas run it), fed
the encoder deployment's embeddings: transformers' greedy tokens and full log-probabilities at every
step, for requests batched in one engine."""

from __future__ import annotations

import os
import time

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


def test_prefill_on_one_engine_and_decode_on_another_equal_one_engine(cars_jpg, vllm_probes, tmp_path):
    """TriInfer's P and D on two vLLM engines, the KV cache handed over by the KV connector: the
    reply's tokens and every step's log-probabilities (the chosen token's and the five most likely)
    are transformers' greedy ones, for text and image prompts prefilled in chunks; each hand-off is
    taken by decode (or by prefill, for a reply that ended at its token: no decode loads it) and
    swept after, as is one no decode took once older than the TTL."""
    from prismserve.models import tiny
    from prismserve.tasklib.units import VLLMDecodeTask, VLLMPrefillTask

    path = str(tiny.build("qwen2.5-vl"))
    encoder, llm = adapter_for(path), adapter_for(path)
    encoder.load_encoder("image")
    llm.load_llm(with_encoders=False)
    cases = [
        ChatRequest.of("Say what prismserve is, and why a serving system splits prefill from decode. " * 2),
        ChatRequest.of("What is in the picture?", images=[cars_jpg]),
        ChatRequest.of("Say again what prismserve is, and why a serving system splits prefill from decode."),
        ChatRequest.of(
            "In one token: what is prismserve, and why does a serving system split prefill from decode?"
        ),
    ]
    lengths = [STEPS, STEPS, STEPS, 1]
    expected, requests = [], []
    for case, steps in zip(cases, lengths, strict=True):
        messages, media = conversation(case)
        encoded = encoder.encode("image", [m.data for m in media]) if media else []
        reference = llm.generate(llm.llm_inputs(messages, encoded=encoded), steps, with_logits=True)
        logprobs = torch.log_softmax(torch.as_tensor(reference.logits, dtype=torch.float64), -1).numpy()
        expected.append(([llm.tokenizer.decode([t]) for t in reference.token_ids], reference, logprobs))
        handles = [EncodedMedia(modality="image", embeddings=e.embeddings, meta=e.meta) for e in encoded]
        requests.append(LLMInput(conversation=messages, encoded=handles, max_tokens=steps, top_logprobs=5))
    stale = tmp_path / "0123abcd"  # a hand-off no decode took (its decode replica died, say), 10 min old
    stale.mkdir()
    os.utime(stale, (time.time() - 600, time.time() - 600))
    settings = {"model": path, "dtype": "float32", "handoff_dir": str(tmp_path)}
    # Prefill computes prompts in chunks of 32 tokens: each hand-off is saved whole once its last chunk ran.
    chunks = {"engine_args": {"max_num_batched_tokens": 32, "enable_chunked_prefill": True}}
    job = {"prefill": VLLMPrefillTask(**settings, **chunks), "decode": VLLMDecodeTask(**settings)}
    job |= {
        "requests": requests,
        "damaged": [2],
    }  # a layer's file of the last hand-off is lost: decode computes those blocks
    results = vllm_probes.run("vllm_pd_probe.py", job)
    seen: set[str] = set()
    for case, steps, (tokens, reference, logprobs), result in zip(
        cases, lengths, expected, results["requests"], strict=True
    ):
        deltas = result["deltas"]
        assert sum(d.tokens for d in deltas) == steps and deltas[-1].finish_reason == "length"
        chosen = [entry for d in deltas for entry in d.logprobs or ()]
        assert [step.token for step in chosen] == tokens, case.prompt
        for step, token, row in zip(chosen, reference.token_ids, logprobs, strict=True):
            assert step.logprob == pytest.approx(row[token], abs=1e-4), case.prompt
            top = sorted(row, reverse=True)[:5]
            assert [t.logprob for t in step.top] == pytest.approx(top, abs=1e-4), case.prompt
        (handed,) = set(result["saved"]) - {stale.name} - seen  # prefill handed the prompt's KV over ...
        assert result["taken"][handed]  # ... and decode took it (prefill, for the one-token reply)
        seen |= set(result["saved"])
    assert results["left"] == []  # the sweeps deleted what was taken, and the stale hand-off


@pytest.mark.reliability
def test_a_decode_engine_killed_mid_reply_fails_its_request_only_and_its_handoff_is_swept(
    vllm_probes, tmp_path
):
    from prismserve.models import tiny
    from prismserve.tasklib.units import VLLMDecodeTask, VLLMPrefillTask

    path = str(tiny.build("qwen2.5-vl"))
    long = "Say what prismserve is, and why a serving system splits prefill from decode. " * 2
    requests = [
        LLMInput(conversation=conversation(ChatRequest.of(text))[0], max_tokens=200)
        for text in (long, "Tell it again: " + long)
    ]
    settings = {"model": path, "dtype": "float32", "handoff_dir": str(tmp_path)}
    settings |= {"handoff_ttl_s": 6.0, "handoff_grace_s": 1.0}
    job = {"prefill": VLLMPrefillTask(**settings), "decode": VLLMDecodeTask(**settings), "requests": requests}
    result = vllm_probes.run("vllm_pd_kill_probe.py", job)
    assert "EngineDeadError" in result["killed"] or "died" in result["killed"]
    assert sum(d.tokens for d in result["lived"]) == 200  # the other decode's reply, whole
    assert False in result["left"].values()  # the killed decode's hand-off, never taken ...
    assert result["swept"] == []  # ... gone once older than the TTL


def test_a_quantized_checkpoint_runs_quantized_on_vllm(cars_jpg, vllm_probes):
    """The tiny Qwen2.5-VL in compressed-tensors' W8A8 int8, found by vLLM in the checkpoint's
    config (no `quantization` given): it answers, image and text, its first step's log-probabilities
    near those of its weights dequantized on transformers (which loads the format as float32), but
    not equal to them, as the weights' own float32 replies are (1e-4 above): vLLM multiplied int8
    weights by int8 activations."""
    from prismserve.models import tiny
    from prismserve.task.components import checkpoint_config

    path = str(tiny.build("qwen2.5-vl-w8a8"))
    assert checkpoint_config(path)["quantization_config"]["quant_method"] == "compressed-tensors"
    encoder, llm = adapter_for(path), adapter_for(path)
    encoder.load_encoder("image")
    llm.load_llm(with_encoders=False)
    cases = [
        ChatRequest.of("What is prismserve?"),
        ChatRequest.of("What is in the picture?", images=[cars_jpg]),
    ]
    references, requests = [], []
    for case in cases:
        messages, media = conversation(case)
        encoded = encoder.encode("image", [m.data for m in media]) if media else []
        reference = llm.generate(llm.llm_inputs(messages, encoded=encoded), STEPS, with_logits=True)
        references.append(torch.log_softmax(torch.as_tensor(reference.logits[0], dtype=torch.float64), -1))
        handles = [EncodedMedia(modality="image", embeddings=e.embeddings, meta=e.meta) for e in encoded]
        requests.append(LLMInput(conversation=messages, encoded=handles, max_tokens=STEPS))
    job = {
        "task": VLLMTask(model=path, dtype="float32", engine_args={"max_logprobs": -1}),
        "requests": requests,
    }
    for case, reference, (tokens, logprobs) in zip(
        cases, references, vllm_probes.run("vllm_probe.py", job), strict=True
    ):
        assert len(tokens) == STEPS, case.prompt
        gap = np.abs(logprobs[0] - reference.numpy()).max()
        assert 1e-4 < gap < 0.1, (case.prompt, gap)


def test_a_text_request_is_not_held_behind_a_photos_processing(cars_jpg, vllm_probes):
    """vLLM's raw-prompt path runs every request's tokenization and media processing on one
    thread in turn, so a text request waited out the processing of every photo queued before it
    (28 ms behind four photos on the tiny Qwen2.5-VL); rendered as vLLM's server renders, the text
    is tokenized apart from the media processor. Here the photo's processing is held until the
    text request has been answered or 20 s have passed."""
    from prismserve.models import tiny
    from prismserve.task.components import MediaItem

    path = str(tiny.build("qwen2.5-vl"))
    question = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    job = {
        "task": VLLMTask(model=path, dtype="float32", with_encoders=True),
        "image": LLMInput(
            conversation=question, media=[MediaItem(modality="image", data=cars_jpg)], max_tokens=4
        ),
        "text": LLMInput(conversation=[{"role": "user", "content": "What is prismserve?"}], max_tokens=4),
    }
    result = vllm_probes.run("vllm_render_probe.py", job)
    assert result["answered_while_held"], result
    assert len(result["text"]) == len(result["image"]) == 4  # both answered in full
