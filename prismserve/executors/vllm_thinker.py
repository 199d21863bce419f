"""The Qwen2.5-Omni thinker on vLLM's async engine (`VLLMThinkerTask`): text streamed per token, then
the talker's conditioning, as `ThinkerExecutor` gives them on transformers.

The talker needs, at every position the thinker was fed (prompt and reply), the thinker's input
embedding and last hidden state. vLLM hands hidden states out without a fork: the engine runs the
`extract_hidden_states` speculative method, which caches the last decoder layer's output (before the
final norm) in the KV pool, and `vllm_extensions.CPUHiddenStatesConnector` writes a finished
request's rows to a safetensors file in this replica's scratch directory. Here the file is read
(and deleted), the thinker's final RMSNorm applied, the input embeddings looked up in the thinker's
embedding table (both loaded from the checkpoint), and the conditioning built by the same
`talker_conditioning` the transformers thinker uses. Only requests that ask for speech are saved.

Media: images arrive as the encoder deployment's embeddings (or raw with `with_encoders`); audio
arrives raw, because vLLM 0.32's Omni thinker takes no audio embeddings and runs the audio tower
itself — the thinker deployment keeps it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from prismserve.executors.base import media_rejected
from prismserve.executors.vllm_llm import AUDIO_RATE, VLLMExecutor
from prismserve.models.qwen2_5_omni import TalkerTokens, choose_speaker, talker_conditioning
from prismserve.task import InvalidInputError, Stream
from prismserve.tasklib.units import LLMInput, ThinkerOutput, VLLMThinkerTask

CONNECTOR = "CPUHiddenStatesConnector"
CONNECTOR_MODULE = "prismserve.executors.vllm_extensions"
FAMILY = "qwen2.5-omni"


class VLLMThinkerExecutor(VLLMExecutor):
    """Streams the thinker's text from vLLM and, when speech is asked for, the talker's conditioning."""

    task: VLLMThinkerTask

    async def load(self) -> None:
        self.config = json.loads(_checkpoint_file(self.task.model, "config.json").read_text())
        self.states_dir = tempfile.mkdtemp(prefix="prismserve-thinker-states-")
        await super().load()
        self.weights = await asyncio.to_thread(ThinkerWeights.load, self.task.model, self.config)
        self.speakers = await asyncio.to_thread(_speakers, self.task.model)
        self.tokens = TalkerTokens.of(self.config)
        self.eos_ids = await asyncio.to_thread(self._eos_ids)

    def engine_settings(self) -> dict[str, Any]:
        layers = self.config["thinker_config"]["text_config"]["num_hidden_layers"]
        return {
            **super().engine_settings(),
            # The last layer's output (before the norm) of every position, cached beside the KV.
            "speculative_config": {
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [layers]}},
            },
            "kv_transfer_config": {
                "kv_connector": CONNECTOR,
                "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": self.states_dir},
            },
        }

    def _eos_ids(self) -> set[int]:
        """The ids vLLM ends generation on: the tokenizer's end token and the generation config's."""
        from transformers import GenerationConfig

        ids = {self.tokenizer.eos_token_id}
        try:
            configured = GenerationConfig.from_pretrained(self.task.model).eos_token_id
        except OSError:  # no generation_config.json
            configured = None
        ids.update(configured if isinstance(configured, list) else [configured])
        return {int(i) for i in ids if i is not None}

    def check_media(self, request: LLMInput) -> None:
        if self.task.with_encoders:
            return
        if any(e.modality == "audio" for e in request.encoded):
            raise InvalidInputError(
                f"the vLLM thinker of {self.task.model} takes audio raw, not as embeddings (vLLM 0.32 runs "
                "the audio tower itself): do not fission the audio encoder (OmniTask(engine='vllm') does not)"
            )
        raw = sorted({m.modality for m in request.media} - {"audio"})
        if raw:
            raise InvalidInputError(
                f"this deployment of {self.task.model} has no {', '.join(raw)} encoder: send embeddings, "
                "not raw media"
            )

    async def run(self, task_input: Any) -> ThinkerOutput:
        request = LLMInput.model_validate(task_input)
        with media_rejected():
            prompt = self.prompt(request)  # bad input fails the call itself
            speaker = choose_speaker(self.speakers, request.speaker, FAMILY) if request.speech else None
        # Only requests with transfer parameters are saved (CPUHiddenStatesConnector).
        saving = {"kv_transfer_params": {"include_output_tokens": True}} if request.speech else None
        outputs = self.outputs(request, prompt=prompt, extra_args=saving)
        # The first output (or vLLM's refusal of the input, an InvalidInputError) before answering.
        first = await anext(outputs, None)
        text: Stream[str] = Stream("text")
        talker: Stream[Any] = Stream("talker")

        async def think() -> None:
            prompt_ids: list[int] = []
            generated: list[int] = []
            final = None
            try:
                pending = [first] if first is not None else []
                async for out in _chain(pending, outputs):
                    prompt_ids = prompt_ids or list(out.prompt_token_ids or [])
                    generated += out.outputs[0].token_ids
                    if out.outputs[0].text:
                        text.put(out.outputs[0].text)
                    final = out
            except Exception as exc:  # noqa: BLE001 - both consumers get the thinker's error
                text.fail(exc)
                talker.fail(exc)
                return
            text.close()
            try:
                if speaker is not None:
                    path = (final.kv_transfer_params or {}).get("hidden_states_path") if final else None
                    if path is None:
                        raise RuntimeError("vLLM saved no hidden states for this request")
                    talker.put(
                        await asyncio.to_thread(
                            self.conditioning, request, prompt, prompt_ids, generated, path, speaker
                        )
                    )
                talker.close()
            except Exception as exc:  # noqa: BLE001 - the talker's consumer gets the error
                talker.fail(exc)

        self.spawn(think())
        return ThinkerOutput(text=text, talker=talker)

    def conditioning(
        self,
        request: LLMInput,
        prompt: dict[str, Any],
        prompt_ids: list[int],
        generated: list[int],
        path: str,
        speaker: str,
    ) -> dict[str, np.ndarray]:
        """The talker's conditioning from the hidden states vLLM saved at `path` (deleted after)."""
        import torch
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            cleanup_hidden_states,
            load_hidden_states,
        )

        try:
            saved = load_hidden_states(path)  # waits for the connector's write to finish
        finally:
            cleanup_hidden_states(path)
        fed = prompt_ids + generated[:-1]  # the last token was generated, never fed
        if saved["token_ids"].tolist() != fed:
            raise RuntimeError(f"the hidden states at {path} are of another sequence than this request's")
        weights = self.weights
        with torch.inference_mode():
            out = talker_conditioning(
                torch.tensor(prompt_ids),
                weights.embed(fed),
                weights.norm(saved["hidden_states"][:, 0]),
                generated,
                weights.embed,
                speaker_bos=int(self.speakers[speaker]["bos_token"]),
                tokens=self.tokens,
                eos_ids=self.eos_ids,
            )
        return {**out, **self.media_positions(request, prompt)}

    def media_positions(self, request: LLMInput, prompt: dict[str, Any]) -> dict[str, np.ndarray]:
        """What the talker needs to place the prompt's media (its own M-RoPE): the images' grids and
        the audio clips' mel-feature lengths, in conversation order."""
        data = prompt.get("multi_modal_data", {})
        out: dict[str, np.ndarray] = {}
        images = data.get("image")
        if isinstance(images, dict):  # the encoder deployment's embeddings
            out["image_grid_thw"] = images["image_grid_thw"].numpy()
        elif images:  # raw: the grids vLLM's image processor makes of them
            out["image_grid_thw"] = self._processors.images(images=images, return_tensors="np")[
                "image_grid_thw"
            ]
        clips = data.get("audio")
        if clips:
            features = self._processors.audio(
                [samples for samples, _ in clips],
                sampling_rate=AUDIO_RATE,
                return_attention_mask=True,
                return_tensors="np",
            )
            out["audio_feature_lengths"] = features["attention_mask"].sum(-1)
        return out

    @cached_property
    def _processors(self) -> _Processors:
        return _Processors(self.task.model)

    async def close(self) -> None:
        await super().close()
        states = getattr(self, "states_dir", None)
        if states is not None:
            shutil.rmtree(states, ignore_errors=True)


class ThinkerWeights:
    """The thinker's embedding table and final RMSNorm, read from the checkpoint's safetensors."""

    EMBED = "thinker.model.embed_tokens.weight"
    NORM = "thinker.model.norm.weight"

    def __init__(self, table: Any, norm_weight: Any, eps: float) -> None:
        self.table, self.norm_weight, self.eps = table, norm_weight, eps

    @classmethod
    def load(cls, model: str, config: dict[str, Any]) -> ThinkerWeights:
        """Only the two tensors, from whichever safetensors file holds each."""
        from safetensors import safe_open

        tensors = {}
        for name, file in _weight_files(model, [cls.EMBED, cls.NORM]).items():
            with safe_open(str(file), framework="pt") as f:
                tensors[name] = f.get_tensor(name)
        eps = config["thinker_config"]["text_config"].get("rms_norm_eps", 1e-6)
        return cls(tensors[cls.EMBED], tensors[cls.NORM], eps)

    def embed(self, token_ids: list[int]) -> Any:
        """Input embeddings `[n, hidden]` of token ids."""
        import torch

        return self.table[torch.tensor(token_ids, dtype=torch.long)]

    def norm(self, hidden: Any) -> Any:
        """The thinker's final RMSNorm, computed as transformers' Qwen2 RMSNorm computes it."""
        import torch

        dtype = hidden.dtype
        x = hidden.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.norm_weight * x.to(dtype)


class _Processors:
    """The checkpoint's image processor and audio feature extractor (as vLLM loads them), on first use."""

    def __init__(self, model: str) -> None:
        from transformers import AutoImageProcessor, WhisperFeatureExtractor

        self.images = AutoImageProcessor.from_pretrained(model)
        self.audio = WhisperFeatureExtractor.from_pretrained(model)


async def _chain(first: list[Any], rest: Any) -> Any:
    """`first`'s items, then the async iterator `rest`'s."""
    for item in first:
        yield item
    async for item in rest:
        yield item


def _checkpoint_file(model: str, name: str) -> Path:
    """A file of the checkpoint (a local directory, or a hub id in the local cache or downloaded)."""
    local = Path(model, name)
    if local.is_file():
        return local
    from transformers.utils import cached_file

    found = cached_file(model, name)
    if found is None:
        raise FileNotFoundError(f"{model} has no {name}")
    return Path(found)


def _weight_files(model: str, names: list[str]) -> dict[str, Path]:
    """The safetensors file holding each named tensor (one file, or a sharded checkpoint's index)."""
    try:
        index = json.loads(_checkpoint_file(model, "model.safetensors.index.json").read_text())
    except OSError:  # not sharded
        single = _checkpoint_file(model, "model.safetensors")
        return dict.fromkeys(names, single)
    return {name: _checkpoint_file(model, index["weight_map"][name]) for name in names}


def _speakers(model: str) -> dict[str, Any]:
    """The checkpoint's speaker map (`spk_dict.pt`: speaker -> its text-start token and voice)."""
    import torch

    return torch.load(_checkpoint_file(model, "spk_dict.pt"), weights_only=True)
