"""Model-family adapters: how to load a checkpoint's parts, and what crosses each boundary.

An adapter wraps one checkpoint directory (or hub id) and loads only the part a replica runs: the
multimodal encoders (`load_encoder`), the LLM fed with precomputed embeddings (`load_llm(False)`),
or the whole model taking raw media (`load_llm(True)`, the monolith). Everything is loaded through
the real `from_pretrained` path; parts a replica does not run are dropped right after loading.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import logging
import os
import re
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from prismserve.errors import MediaError
from prismserve.offline import DEVICE_VARIABLE, disable_telemetry
from prismserve.task.components import checkpoint_dtype

log = logging.getLogger(__name__)

# transformers' from_pretrained builds models under a process-wide meta-device context: two loads in
# threads of one process (in-process executors) corrupt each other. Replicas are processes of their own.
LOADING = threading.Lock()


@dataclass
class Encoded:
    """One media item's encoder output: its embeddings (`[tokens, hidden]`, or a layout the family
    defines: InternVL3 `[tiles, tokens, hidden]`, Qwen3-Omni images `[1 + levels, tokens, hidden]`)
    and what the LLM needs to place them (`meta`)."""

    modality: str
    embeddings: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generated:
    """Generated token ids and, when asked for, the logits of every step (`[steps, vocab]`)."""

    token_ids: list[int]
    logits: np.ndarray | None = None
    hidden_states: Any = None  # transformers' per-step hidden states, when asked for
    finish_reason: str = "stop"  # "length": cut by max_tokens or the context, not ended by the model
    prompt_tokens: int = 0


@dataclass
class MediaInput:
    """A raw media item of a conversation, in conversation order."""

    modality: str
    data: bytes


def quiet_transformers() -> None:
    """Keep replicas' logs readable: no weight-loading progress bars, no per-config warnings."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def requested_device() -> str | None:
    """The device `PRISMSERVE_DEVICE` asks for (`cpu`, `cuda`, `cuda:N`), or None when it is unset
    or empty (then the device is whatever torch sees)."""
    value = os.environ.get(DEVICE_VARIABLE, "").strip()
    if not value:
        return None
    if value != "cpu" and value != "cuda" and not re.fullmatch(r"cuda:\d+", value):
        raise ValueError(
            f"{DEVICE_VARIABLE}={value!r} names no device: set it to cpu, cuda or cuda:N, or unset it"
        )
    return value


def default_device() -> str:
    """The device models load on: `PRISMSERVE_DEVICE` when set, else `cuda` when torch sees a GPU,
    else `cpu`. A replica Ray placed on GPUs never gets here without CUDA unless the variable says
    `cpu` (`executors.loading.check_device` refuses to start it)."""
    requested = requested_device()
    if requested is not None:
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_pretrained(model_class: Any, path: str, device: str, dtype: str = "auto", **config: Any) -> Any:
    """`model_class.from_pretrained(path)` in eval mode, its tensors read from the checkpoint straight
    onto `device` (`device_map`) in `dtype` (`load_dtype`): no whole copy in host memory first on the
    way to a GPU. `config` overrides the checkpoint's configuration (`enable_audio_output=False`: the
    parts it leaves out are not built, so their weights are never read).

    transformers 5.2x takes "meta" in a device_map, but a map of two devices dispatches the model
    through accelerate's hooks, which pick a main device among them (the CPU's modules then become
    offloaded meta tensors): parts a replica drops are loaded, then deleted (docs/models.md)."""
    with LOADING:
        model = model_class.from_pretrained(
            path, dtype=load_dtype(path, dtype, device), device_map=device, **config
        )
    return model.eval()


def load_dtype(path: str, dtype: str, device: str) -> str:
    """The dtype a transformers component of checkpoint `path` loads in on `device`: `dtype`, where
    `auto` is the checkpoint's own (its config's; transformers' "auto" reads it, sub-configs too;
    transformers' own default would be float32), as on the vLLM engine. A CUDA device without
    bfloat16 (before Ampere) runs a bfloat16 checkpoint in float16, and says so."""
    wanted = checkpoint_dtype(path) if dtype == "auto" else dtype
    if wanted == "bfloat16" and device.startswith("cuda"):
        import torch

        if not torch.cuda.is_bf16_supported():
            log.warning("%s: this GPU has no bfloat16; its weights run in float16", path)
            return "float16"
    return dtype  # "auto" as transformers takes it: each sub-config's own dtype


def safetensors_sizes(path: Path) -> dict[str, int]:
    """Each tensor's bytes in the safetensors files of the checkpoint at `path`, from their headers
    (an 8-byte length, then JSON naming each tensor's byte range)."""
    sizes: dict[str, int] = {}
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                start, end = entry["data_offsets"]
                sizes[name] = end - start
    return sizes


class Adapter(ABC):
    """One model family: which parts a checkpoint has, how to run each, what crosses between them."""

    family: ClassVar[str]
    encoder_modalities: ClassVar[tuple[str, ...]] = ()

    def __init__(self, path: str, device: str | None = None, dtype: str = "auto") -> None:
        disable_telemetry()
        quiet_transformers()
        self.path = path
        self.device = device or default_device()
        self.dtype = dtype  # the weights' (`load_dtype`)
        self.model: Any = None
        # transformers models are not safe to run from several threads at once.
        self.lock = threading.Lock()

    # Tensor-name prefixes of each component's weights, by the component names the apps give GPUs to
    # ("image", "audio", "talker" …); the tensors no prefix claims are the LLM's ("llm", "thinker").
    component_prefixes: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def component_bytes(cls, path: Path) -> dict[str, int]:
        """Bytes of each component's weights in the checkpoint at `path` (a local directory), read
        from its safetensors headers, no tensor loaded; "" holds what no prefix claims (the LLM's).
        Components may share weights (Qwen2.5-VL's image and video encoders are one tower)."""
        tensors = safetensors_sizes(path)
        sizes = {
            component: sum(size for name, size in tensors.items() if name.startswith(prefixes))
            for component, prefixes in cls.component_prefixes.items()
        }
        claimed = tuple(p for prefixes in cls.component_prefixes.values() for p in prefixes)
        sizes[""] = sum(size for name, size in tensors.items() if not (claimed and name.startswith(claimed)))
        return sizes

    @classmethod
    def voices(cls, path: Path) -> tuple[str, ...]:
        """The speakers of the checkpoint at `path` (a local directory), its default first, read
        from its files without loading the model; () for a family that does not speak."""
        return ()

    # --- encoders -------------------------------------------------------------------------------
    @abstractmethod
    def load_encoder(self, modality: str) -> None:
        """Load only the encoder of `modality`."""

    def check_modality(self, modality: str) -> None:
        """Raise MediaError unless the checkpoint has an encoder for `modality`."""
        if modality not in self.encoder_modalities:
            raise MediaError(
                f"{self.family} has no {modality} encoder; it encodes {', '.join(self.encoder_modalities)}"
            )

    @abstractmethod
    def encode(self, modality: str, items: list[bytes]) -> list[Encoded]:
        """Encode a batch of media items of one modality; one result per item, in order."""

    # --- LLM ------------------------------------------------------------------------------------
    @abstractmethod
    def load_llm(self, with_encoders: bool) -> None:
        """Load the LLM; `with_encoders` keeps the encoders too (the monolith takes raw media)."""

    @abstractmethod
    def llm_inputs(
        self,
        conversation: list[dict[str, Any]],
        encoded: list[Encoded] | None = None,
        media: list[MediaInput] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Model inputs for a chat-template conversation whose media parts are `{"type": modality}`.

        Either `encoded` (precomputed embeddings, fissioned) or `media` (raw, monolith), in the
        conversation's media order; `tools` are the functions the chat template shows the model.
        """

    def generate(
        self,
        inputs: dict[str, Any],
        max_tokens: int,
        *,
        temperature: float = 0.0,
        seed: int | None = None,
        on_token: Callable[[int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        with_logits: bool = False,
        with_hidden: bool = False,
    ) -> Generated:
        """Generate up to `max_tokens` with transformers' own `generate`, one request at a time (greedy
        at temperature 0); `on_token` sees each id as it comes, `should_stop` ends generation early.

        Serving goes through `executors.hf_engine.HFEngine` (batched); this is its reference in the
        equality tests and the one-at-a-time baseline of `benchmarks/bench_hf_batching.py`."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        class _Stop(StoppingCriteria):
            def __init__(self, stop: Callable[[], bool]) -> None:
                self.stop = stop

            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.full(
                    (input_ids.shape[0],), self.stop(), dtype=torch.bool, device=input_ids.device
                )

        sampling = (
            {"do_sample": False} if temperature <= 0 else {"do_sample": True, "temperature": temperature}
        )
        with self.lock, torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.llm().generate(
                **inputs,
                max_new_tokens=max_tokens,
                streamer=token_streamer(on_token) if on_token is not None else None,
                stopping_criteria=StoppingCriteriaList(
                    [_Stop(should_stop)] if should_stop is not None else []
                ),
                output_logits=with_logits,
                output_hidden_states=with_hidden,
                return_dict_in_generate=True,
                **sampling,
            )
        prompt_length = inputs["input_ids"].shape[1]
        tokens = out.sequences[0, prompt_length:].tolist()
        logits = torch.cat(out.logits).float().cpu().numpy() if with_logits else None
        return Generated(tokens, logits, out.hidden_states if with_hidden else None)

    def llm(self) -> Any:
        """The module whose `generate` produces text."""
        return self.model

    @property
    @abstractmethod
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer."""

    def eos_token_ids(self) -> set[int]:
        """Ids that end generation."""
        ids = self.llm().generation_config.eos_token_id
        return set(ids if isinstance(ids, list) else [ids] if ids is not None else [])

    def vllm_embeddings(self, items: list[Encoded]) -> Any:
        """What vLLM's `multi_modal_data[modality]` takes for the precomputed embeddings of one
        modality's items, in order. vLLM's generic form (InternVL3, Gemma 3): one `[tokens, hidden]`
        tensor per item, whose rows size the item's placeholder; a family's extra metadata is implied."""
        import torch

        return [torch.as_tensor(e.embeddings).reshape(-1, e.embeddings.shape[-1]) for e in items]


def token_streamer(on_token: Callable[[int], None]) -> Any:
    """A transformers streamer that calls `on_token` with each generated id (not the prompt's)."""
    from transformers.generation.streamers import BaseStreamer

    class _Streamer(BaseStreamer):
        prompt_seen = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:  # generate() hands the prompt over first
                self.prompt_seen = True
                return
            for token in value.reshape(-1).tolist():
                on_token(token)

        def end(self) -> None:
            pass

    return _Streamer()


def build_processor(processor_class: type[Any], path: str, **parts: Any) -> Any:
    """`processor_class` assembled from the checkpoint's tokenizer and image processor.

    Assembled from parts because `AutoProcessor` insists on a video processor (torchvision-backed)
    that image-only serving does not need.
    """
    from transformers import AutoImageProcessor, AutoTokenizer

    class _Processor(processor_class):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument is None:  # a part this deployment does without
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    import inspect

    tokenizer = AutoTokenizer.from_pretrained(path)
    defaults = {"image_processor": AutoImageProcessor.from_pretrained(path), "video_processor": None}
    accepted = inspect.signature(processor_class.__init__).parameters
    defaults = {k: v for k, v in defaults.items() if k in accepted}
    return _Processor(
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
        **{**defaults, **_settings(processor_class, path), **parts},
    )


def _settings(processor_class: type[Any], path: str) -> dict[str, Any]:
    """The processor's own settings from the checkpoint's processor_config.json (`image_seq_length` …)."""
    import inspect
    import json
    from pathlib import Path

    from transformers.utils import cached_file

    found = Path(path, "processor_config.json") if Path(path, "processor_config.json").is_file() else None
    if found is None:
        cached = cached_file(path, "processor_config.json", _raise_exceptions_for_missing_entries=False)
        found = Path(cached) if cached else None
    if found is None:
        return {}
    accepted = set(inspect.signature(processor_class.__init__).parameters) - {"self", "tokenizer", "image_processor",
                                                                             "video_processor", "feature_extractor", "chat_template"}  # fmt: skip
    return {k: v for k, v in json.loads(found.read_text()).items() if k in accepted}


def qwen_vllm_embeddings(items: list[Encoded]) -> dict[str, Any]:
    """The Qwen-VL form of vLLM's precomputed embeddings (its parsers declare embedding fields):
    `{modality}_embeds`, every item's rows concatenated, and each metadata key stacked by item
    (`image_grid_thw` places the items and sizes their placeholders)."""
    import torch

    modality = items[0].modality
    data = {f"{modality}_embeds": torch.cat([torch.as_tensor(e.embeddings) for e in items])}
    for key in items[0].meta:
        data[f"{modality}_{key}"] = torch.tensor([e.meta[key] for e in items])
    return data


def as_numpy(tensor: Any) -> np.ndarray:
    """A CPU float32 numpy copy of a torch tensor (numpy has no bfloat16; the data plane moves numpy)."""
    return tensor.detach().float().cpu().numpy()


def context_length(module: Any) -> int | None:
    """How many tokens `module` attends to, prompt and reply together (its text config's
    `max_position_embeddings`), or None if its config does not say."""
    config = module.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "max_position_embeddings", None)


class EngineModel:
    """What an `HFEngine` generates with: a module whose `generate` prefills, the ids that end a
    request, how a decoding step is fed and what a request streams. This default serves a family's
    LLM (or thinker) through its adapter; models fed more than their last token per step (the Omni
    talkers) subclass it."""

    keeps_hidden: ClassVar[bool] = False
    """Whether the engine asks every forward for its hidden states and keeps each row's last layer at
    its last position (`Sequence.last_hidden`): for models whose next step is built from it (Qwen3-Omni's
    code predictor)."""

    def __init__(self, module: Any, end_ids: set[int], tokenizer: Any = None) -> None:
        self.module = module
        self.end_ids = end_ids
        self.tokenizer = tokenizer  # what its ids mean, for JSON replies (None: a model that writes no text)

    @classmethod
    def of(cls, adapter: Any) -> EngineModel:
        """A family adapter's LLM (its `llm()`, ending on its end-of-sequence ids)."""
        return cls(adapter.llm(), adapter.eos_token_ids(), adapter.tokenizer)

    def position_offset(self) -> int:
        """How far the decode positions of the prompt just prefilled are shifted from its length:
        Qwen's M-RoPE `rope_deltas` (media take fewer positions than tokens), else 0."""
        deltas = getattr(getattr(self.module, "model", None), "rope_deltas", None)
        return 0 if deltas is None else int(deltas.reshape(-1)[0])

    def generation_config(self, sampling: Any) -> Any:
        """The generation config a request's logits processors come from: the checkpoint's, under
        what the request's `Sampling` sets (temperature 0: greedy; unset: as the checkpoint says)."""
        config = copy.deepcopy(self.module.generation_config)
        if sampling.temperature is not None:
            config.update(do_sample=sampling.temperature > 0)
            if sampling.temperature > 0:
                config.update(temperature=sampling.temperature)
        for name in ("top_p", "top_k", "min_p", "repetition_penalty"):
            if getattr(sampling, name) is not None:
                config.update(**{name: getattr(sampling, name)})
        return config

    def context_length(self) -> int | None:
        """How many tokens the model attends to, prompt and reply together."""
        return context_length(self.module)

    def step_inputs(self, rows: list[Any], ids: Any) -> dict[str, Any]:
        """The model inputs of one decoding step for `rows` (the engine's sequences), `ids` ([rows, 1])
        being each row's last token."""
        return {"input_ids": ids}

    def last_hidden(self, hidden_states: Any) -> Any:
        """`[rows, hidden]`: the last layer's state at the last position, from one forward's
        `hidden_states` (read only when `keeps_hidden`)."""
        return hidden_states[-1][:, -1]

    def stream(self, sequence: Any, token: int) -> None:
        """Hand `token`, just chosen for `sequence`, to its caller (`Sequence.emit`): requests stream
        their ids. Models that stream something else (Qwen3-Omni's frames) override it."""
        sequence.emit(token)


class VocoderStream(Protocol):
    """One utterance decoded to audio while its codes arrive (a family's `vocoder_stream`)."""

    def push(self, codes: list[Any]) -> np.ndarray:
        """Audio (float samples) that these codes complete; often none."""

    def finish(self) -> np.ndarray:
        """The rest of the utterance's audio."""


class Playout:
    """When a stream's listener needs its next audio: at once until the first audio is handed out,
    then when the audio handed out so far has played (it plays in real time from that moment)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.started: float | None = None
        self.samples = 0

    def deadline(self) -> float:
        """The `time.monotonic()` by which the next audio must be there to play without a gap."""
        return time.monotonic() if self.started is None else self.started + self.samples / self.rate

    def handed_out(self, samples: int) -> None:
        """Count `samples` more of audio as given to the listener (now)."""
        if samples and self.started is None:
            self.started = time.monotonic()
        self.samples += samples


class ThreadBatcher:
    """Batches calls made from many threads: `batcher(key, item, deadline)` blocks until
    `handler(key, items)` has run on a batch holding `item` and returns its result for it. Items of
    one key go together (at most `max_batch`); a worker thread of its own runs one batch at a time,
    the group of the waiting item with the earliest deadline first (by default its arrival: oldest
    first). For model parts whose callers are per-request threads (a vocoder's streams), where
    `executors.base.AsyncBatcher` cannot reach; a vocoder's streams pass their `Playout` deadline, so that a new
    stream's first audio goes before audio other streams' listeners will not need for a while."""

    def __init__(self, handler: Callable[[Any, list[Any]], list[Any]], max_batch: int = 8) -> None:
        self.handler = handler
        self.max_batch = max(1, max_batch)
        self.peak_batch = 0  # the most items run together so far (tests read it)
        self._waiting: list[tuple[float, Any, Any, concurrent.futures.Future[Any]]] = []
        self._ready = threading.Condition()
        threading.Thread(target=self._serve, name="call-batcher", daemon=True).start()

    def __call__(self, key: Any, item: Any, deadline: float | None = None) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        due = time.monotonic() if deadline is None else deadline
        with self._ready:
            self._waiting.append((due, key, item, future))
            self._ready.notify()
        return future.result()

    def _serve(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: bool(self._waiting))
                self._waiting.sort(key=lambda w: w[0])  # stable: equal deadlines keep arrival order
                key = self._waiting[0][1]
                batch = [w for w in self._waiting if w[1] == key][: self.max_batch]
                self._waiting = [w for w in self._waiting if all(w is not b for b in batch)]
            self.peak_batch = max(self.peak_batch, len(batch))
            try:
                results = self.handler(key, [item for _, _, item, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every caller of the batch gets the error
                for *_, future in batch:
                    future.set_exception(exc)
                continue
            for (*_, future), result in zip(batch, results, strict=True):
                future.set_result(result)
