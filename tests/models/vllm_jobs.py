"""Probe scripts run in the vLLM environment (with the Python and paths its replicas get), and the
checks built on them."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from prismserve.executors import envs
from prismserve.models import adapter_for
from prismserve.models.conditioning import merged
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import EncodedMedia, LLMInput, conversation
from prismserve.tasklib.units import VLLMThinkerDecodeTask, VLLMThinkerPrefillTask, VLLMThinkerTask

PROBES = Path(__file__).parents[1] / "runtime"


class VLLMProbes:
    """Runs the probe scripts of tests/runtime (`main(source, target)`) in one process of the vLLM
    environment, with the Python and paths its replicas get, for the whole test run: vLLM and the
    executors are imported once, each family's engine started once, and an engine's shutdown
    overlaps what the test does next (`vllm_probe_server.py`). Jobs and results travel as pickles."""

    def __init__(self) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="prismserve-vllm-probes-")
        self.jobs = itertools.count()
        self.server: subprocess.Popen[str] | None = None

    def start(self) -> subprocess.Popen[str]:
        """The server process, started if none runs (a new one after a job that timed out)."""
        if self.server is None or self.server.poll() is not None:
            env = envs.runtime_env("vllm")
            self.server = subprocess.Popen(
                [env["py_executable"], str(PROBES / "vllm_probe_server.py")],
                stdin=subprocess.PIPE,
                env={**os.environ, **env["env_vars"]},
                text=True,
                start_new_session=True,  # its engines' processes with it: killed as one group
            )
        return self.server

    def run(self, probe: str, job: dict[str, Any], timeout: float = 600) -> Any:
        """What `tests/runtime/{probe}` writes for `job`."""
        index = next(self.jobs)
        source, target = (Path(self.folder.name) / f"{index}.{name}.pkl" for name in ("job", "out"))
        failed = target.with_name(target.name + ".error")
        source.write_bytes(pickle.dumps(job))
        server = self.start()
        assert server.stdin is not None
        server.stdin.write(f"{probe}\t{source}\t{target}\n")
        server.stdin.flush()
        deadline = time.monotonic() + timeout
        while not target.exists():
            if failed.exists():
                raise AssertionError(f"{probe} failed in the vLLM environment:\n{failed.read_text()}")
            if server.poll() is not None:
                raise AssertionError(f"the vLLM probe server exited ({server.returncode}) running {probe}")
            if time.monotonic() > deadline:
                self.stop(wait=0)
                raise TimeoutError(f"{probe} wrote nothing within {timeout:.0f} s")
            time.sleep(0.1)
        return pickle.loads(target.read_bytes())

    def stop(self, wait: float = 60) -> None:
        """Stop the server: it finishes the job at hand (its engine's shutdown) first if it does so
        within `wait` seconds, else it is killed with its engines' processes."""
        if self.server is not None and self.server.poll() is None:
            assert self.server.stdin is not None
            self.server.stdin.close()
            try:
                self.server.wait(wait)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()

    def close(self) -> None:
        """Stop the server and remove the jobs' files."""
        self.stop()
        self.folder.cleanup()


def omni_cases(image: bytes, other_image: bytes, audio: bytes) -> list[ChatRequest]:
    """Requests an Omni thinker is checked on: text only, an image, audio, both, two images."""
    return [
        ChatRequest.of("What is prismserve?"),
        ChatRequest.of("What is in the picture?", images=[image]),
        ChatRequest.of("Answer.", audios=[audio]),
        ChatRequest.of("Answer the question about the picture.", images=[image], audios=[audio]),
        ChatRequest.of("Compare the two pictures.", images=[image, other_image]),
    ]


def thinker_references(
    path: str, cases: list[ChatRequest], steps: int, **request: Any
) -> tuple[Any, Any, list[tuple[Any, dict[str, np.ndarray], list[Any]]], list[LLMInput]]:
    """The fissioned transformers thinker's replies to `cases` (`steps` greedy tokens, logits and
    hidden states), the talker's conditioning and codes from them; and the requests a vLLM thinker
    gets for the cases (the image encoder's embeddings and raw audio, speech asked for, `request`'s
    fields). Returns the thinker and talker adapters, the references and the requests."""
    encoders, thinker, talker = (
        {m: adapter_for(path) for m in ("image", "audio")},
        adapter_for(path),
        adapter_for(path),
    )
    for modality, encoder in encoders.items():
        encoder.load_encoder(modality)
    thinker.load_llm(with_encoders=False)
    talker.load_talker()
    speaker = thinker.speaker(None)
    expected, requests = [], []
    for case in cases:
        messages, media = conversation(case)
        encoded = [encoders[m.modality].encode(m.modality, [m.data])[0] for m in media]
        inputs = thinker.llm_inputs(messages, encoded=encoded)
        thought = thinker.generate(inputs, steps, with_logits=True, with_hidden=True)
        conditioning = thinker.talker_inputs(inputs, thought, speaker)
        expected.append((thought, conditioning, talker.talk(conditioning, 40)))
        images = [EncodedMedia(modality="image", embeddings=e.embeddings, meta=e.meta) for e in encoded
                  if e.modality == "image"]  # fmt: skip
        audio = [m for m in media if m.modality == "audio"]  # raw: vLLM runs the audio tower itself
        requests.append(
            LLMInput(
                conversation=messages, encoded=images, media=audio, max_tokens=steps, speech=True, **request
            )
        )
    return thinker, talker, expected, requests


def assert_same_conditioning(
    items: list[Any], conditioning: dict[str, np.ndarray], talker: Any, codes: Any
) -> None:
    """The talker's conditioning items a vLLM thinker gave, merged, equal the transformers thinker's
    (floats within 1e-5), and the talker's codes from them equal."""
    vllm_conditioning = merged(items)
    assert sorted(vllm_conditioning) == sorted(conditioning)
    for name, value in conditioning.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(vllm_conditioning[name], value, atol=1e-5, rtol=0, err_msg=name)
        else:
            np.testing.assert_array_equal(vllm_conditioning[name], value, err_msg=name)
    assert talker.talk(vllm_conditioning, 40) == codes and codes


def stopped_case(
    path: str, case: ChatRequest, ids: list[int], tokenizer: Any, steps: int
) -> tuple[str, Any, LLMInput]:
    """A stop string that ends `case`'s greedy reply (`ids`) at one of its tokens, the transformers
    thinker's reference for a reply of the tokens up to it, and the vLLM request that asks for
    `steps` tokens with that stop string."""
    cut = next(
        k
        for k in range(2, steps)
        if (piece := tokenizer.decode([ids[k]])).strip() and piece not in tokenizer.decode(ids[:k])
    )
    stop = tokenizer.decode([ids[cut]])
    _, _, [shorter], [request] = thinker_references(path, [case], cut + 1, stop=[stop])
    return stop, shorter, request.model_copy(update={"max_tokens": steps})


def check_vllm_thinker(path: str, cases: list[ChatRequest], probes: VLLMProbes, steps: int = 10) -> None:
    """An Omni thinker on vLLM (in its own environment), given the image encoder's embeddings and raw
    audio, against the fissioned transformers thinker, for `cases` batched in one engine: the same
    greedy tokens and text, every step's full log-probabilities within 1e-4, the talker's
    conditioning within 1e-5 and the talker's codes from it equal. The last case (two images) also
    runs with its images swapped and without speech: other log-probabilities, no conditioning. The
    first case also runs with a stop string that ends its reply at a token: the talker's conditioning
    ends there too, as the transformers thinker's for a reply of that many tokens (vLLM generates
    on past the stop). Every hidden-states file the engine saved was read and deleted; an aborted
    request saved none."""
    thinker, talker, expected, requests = thinker_references(path, cases, steps)
    swapped = requests[-1].model_copy(update={"encoded": requests[-1].encoded[::-1], "speech": False})
    stop, shorter, stopped = stopped_case(path, cases[0], expected[0][0].token_ids, thinker.tokenizer, steps)
    job = {
        "task": VLLMThinkerTask(model=path, dtype="float32", engine_args={"max_logprobs": -1}),
        "requests": [*requests, swapped, stopped],
    }
    out = probes.run("vllm_thinker_probe.py", job)
    streamed = 0
    for (thought, conditioning, codes), (tokens, logprobs), (text, items, ahead) in zip(
        expected, out["logprobs"], out["runs"], strict=False
    ):
        reference = torch.log_softmax(torch.as_tensor(thought.logits, dtype=torch.float64), -1).numpy()
        assert tokens == thought.token_ids
        np.testing.assert_allclose(logprobs, reference, atol=1e-4, rtol=0)
        assert text == thinker.tokenizer.decode(thought.token_ids, skip_special_tokens=True) and text, (
            text,
            thinker.tokenizer.decode(thought.token_ids, skip_special_tokens=True),
            thought.token_ids,
        )
        # Streamed: the talker's first item came while the text still did (for replies long enough
        # to show it), its reply rows in items of their own.
        assert ahead is not None or len(thought.token_ids) < 5
        assert len(items) > 2
        streamed += ahead is not None
        assert_same_conditioning(items, conditioning, talker, codes)
    assert streamed >= 2
    swapped_logprobs, (_, swapped_items, _) = out["logprobs"][-2][1], out["runs"][-2]
    assert np.abs(swapped_logprobs[0] - out["logprobs"][-3][1][0]).max() > 1e-3 and swapped_items == []
    stopped_text, stopped_items, _ = out["runs"][-1]
    assert stop not in stopped_text and len(shorter[0].token_ids) < steps
    assert_same_conditioning(stopped_items, shorter[1], talker, shorter[2])
    assert out["left"] == []


def check_vllm_thinker_prefill_decode(
    path: str, cases: list[ChatRequest], probes: VLLMProbes, handoffs: Path, steps: int = 10
) -> None:
    """An Omni thinker split into prefill and decode on two vLLM engines (TriInfer's P and D), the KV
    cache handed over in `handoffs`, against the fissioned transformers thinker, for `cases` all at
    once: the reply's tokens and every step's log-probabilities (the chosen token's and the five most
    likely) equal, the talker's conditioning — read on the decode side alone — within 1e-5 and its
    codes equal. The first case also runs with a reply that ends at prefill's token (one token):
    its conditioning too (same prompt: the same hand-off). A JSON reply (decode generates it whole
    under the schema, prefill's token again) is JSON that validates, spoken. Decode took every
    hand-off, and every hand-off and hidden-states file is gone at the end."""
    thinker, talker, expected, requests = thinker_references(path, cases, steps, top_logprobs=5)
    _, _, (one,), (short,) = thinker_references(path, cases[:1], 1, top_logprobs=5)
    settings = {"model": path, "dtype": "float32", "handoff_dir": str(handoffs), "handoff_grace_s": 1.0}
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    schema["additionalProperties"] = False
    _, _, _, (asked,) = thinker_references(path, [ChatRequest.of("Answer in JSON: is it fast?")], 1)
    as_json = asked.model_copy(update={"json_schema": schema, "max_tokens": 16})
    job = {
        "prefill": VLLMThinkerPrefillTask(**settings),
        "decode": VLLMThinkerDecodeTask(**settings),
        "requests": [*requests, short, as_json],
    }
    out = probes.run("vllm_thinker_pd_probe.py", job)
    deltas, items = out["runs"].pop()
    assert json.loads("".join(d.text or "" for d in deltas)) in ({"ok": True}, {"ok": False})
    assert deltas[-1].finish_reason == "stop" and items  # the talker's conditioning came
    for (thought, conditioning, codes), (deltas, items) in zip([*expected, one], out["runs"], strict=True):
        logprobs = torch.log_softmax(torch.as_tensor(thought.logits, dtype=torch.float64), -1).numpy()
        steps_seen = [entry for d in deltas for entry in d.logprobs or ()]
        assert [s.token for s in steps_seen] == [thinker.tokenizer.decode([t]) for t in thought.token_ids]
        for step, token, row in zip(steps_seen, thought.token_ids, logprobs, strict=True):
            assert step.logprob == pytest.approx(row[token], abs=1e-4)
            assert [t.logprob for t in step.top] == pytest.approx(sorted(row, reverse=True)[:5], abs=1e-4)
        assert deltas[-1].finish_reason == "length" and sum(d.tokens for d in deltas) == len(
            thought.token_ids
        )
        assert_same_conditioning(items, conditioning, talker, codes)
    # Every hand-off still there once all were answered was taken (one taken early may already be
    # swept: a short reply's, a grace period before the last request ends), and the sweep left none: it
    # deletes only taken ones before their TTL.
    assert out["taken"] and all(out["taken"].values()), out["taken"]
    assert out["left"] == [] and out["states"] == []
