"""Out-of-tree pieces that vLLM 0.32 needs to run prismserve's split models, registered without a
fork of vLLM.

Imported only in the vLLM environment (by vLLM itself: the plugin in `vllm_plugin.py` registers the
model classes by name, and the engine arguments name `CPUHiddenStatesConnector`'s module).

How an Omni thinker's hidden states come out: the `extract_hidden_states` speculative method
caches one decoder layer's output (before the final norm) of every position a request fed the
model, and a hidden-states KV connector writes a finished request's rows to a safetensors file.
The gaps in vLLM 0.32 filled here:
- its Qwen2.5-Omni thinker class does not declare `SupportsEagle3` (its decoder can emit auxiliary
  hidden states, the class does not say so) (`OmniThinker`);
- both Omni thinkers hand precomputed image embeddings to the model as one tensor instead of one per
  image, and their processors fail on a prompt with both precomputed image embeddings and raw audio;
  Qwen3-Omni's parser also drops the image embedding fields (`Qwen3OmniThinker`). Every name
  imported from vLLM here exists in 0.33 too (checked against its wheel; 0.33 fixed the per-image
  split and the Qwen3-Omni parser, which these classes then repeat harmlessly);
- the stock `ExampleHiddenStatesConnector` copies with CUDA streams and pinned memory, which kills a
  CPU engine at the first finished request, it saves every request, and only once the request has
  finished (`CPUHiddenStatesConnector`: also streams a request's rows while it runs, when asked);
- its Gemma 3 takes no precomputed image embeddings at all (`Gemma3Embeds`);
- its file-based KV connector (`ExampleConnector`, the one that runs on a CPU) never deletes what it
  saved, and its decode side saves too (`HandoffConnector`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    align_to_block_size,
)
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    ExampleHiddenStatesConnectorMetadata,
    PendingSave,
    extract_from_kv_cache,
)
from vllm.model_executor.models.gemma3_mm import (
    Gemma3DummyInputsBuilder,
    Gemma3ForConditionalGeneration,
    Gemma3MultiModalProcessor,
    Gemma3ProcessingInfo,
)
from vllm.model_executor.models.interfaces import SupportsEagle3
from vllm.model_executor.models.qwen2_5_omni_thinker import (
    Qwen2_5OmniThinkerDummyInputsBuilder,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen2_5OmniThinkerMultiModalDataParser,
    Qwen2_5OmniThinkerMultiModalProcessor,
    Qwen2_5OmniThinkerProcessingInfo,
)
from vllm.model_executor.models.qwen3_omni_moe_thinker import (
    Qwen3OmniMoeThinkerDummyInputsBuilder,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    Qwen3OmniMoeThinkerMultiModalProcessor,
    Qwen3OmniMoeThinkerProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import ImageEmbeddingItems, ImageProcessorItems
from vllm.multimodal.processing import PromptReplacement, PromptUpdateDetails
from vllm.v1.request import RequestStatus

from prismserve.executors.handoff import HANDOFF_FOLDER, mark_taken


class _RawItemsText:
    """For an Omni thinker's processor: the text its HF processor sees names only the raw items.

    The HF processor sees only raw items (audio); vLLM 0.32 writes a placeholder for the embedding
    items too, which the HF processor then fails to expand (no grid for them)."""

    def _get_hf_mm_inputs(self, mm_items: Any, hf_kwargs: Any) -> Any:
        inputs = super()._get_hf_mm_inputs(mm_items, hf_kwargs)  # type: ignore[misc]
        if "text" in inputs.hf_data and not inputs.hf_kwargs.get("use_audio_in_video"):
            raw = {m: len(items) for m, items in mm_items.items() if items and items.get_processor_data()}
            inputs.hf_data["text"] = self._get_hf_mm_text(raw)  # type: ignore[attr-defined]
        return inputs


class _ImageEmbedsPerImage:
    """For an Omni thinker: precomputed image embeddings handed on as one tensor per image.

    vLLM 0.32's thinkers return the embeddings of all of a request's images as one tensor, which
    their caller then iterates row by row ("Expected number of multimodal embeddings to match
    number of input items"); one tensor per image is what they must return (as Qwen2.5-VL's does)."""

    def _process_image_input(self, image_input: Any) -> tuple[torch.Tensor, ...]:
        if image_input["type"] != "image_embeds":
            return super()._process_image_input(image_input)  # type: ignore[misc]
        dtype = self.visual.dtype  # type: ignore[attr-defined]
        embeds = image_input["image_embeds"]
        if isinstance(embeds, (list, tuple)):
            return tuple(e.type(dtype) for e in embeds)
        merge = self.config.vision_config.spatial_merge_size  # type: ignore[attr-defined]
        sizes = (image_input["image_grid_thw"].prod(-1) // merge // merge).tolist()
        return embeds.type(dtype).split(sizes)


class OmniThinkerProcessor(_RawItemsText, Qwen2_5OmniThinkerMultiModalProcessor):
    """vLLM's Qwen2.5-Omni thinker processor, taking raw audio and precomputed image embeddings in one prompt."""


@MULTIMODAL_REGISTRY.register_processor(
    OmniThinkerProcessor,
    info=Qwen2_5OmniThinkerProcessingInfo,
    dummy_inputs=Qwen2_5OmniThinkerDummyInputsBuilder,
)
class OmniThinker(_ImageEmbedsPerImage, Qwen2_5OmniThinkerForConditionalGeneration, SupportsEagle3):
    """vLLM's Qwen2.5-Omni thinker, able to emit its last layer's hidden states (EAGLE-3's auxiliary
    states, which `extract_hidden_states` caches), and taking several precomputed images per prompt,
    beside raw audio."""


class _Qwen3ThinkerInfo(Qwen3OmniMoeThinkerProcessingInfo):
    """vLLM 0.32's Qwen3-Omni processing info with the parser vLLM 0.33 gives it: Qwen2.5-Omni's,
    which keeps the image embedding fields (0.32's own parser drops them)."""

    def get_data_parser(self) -> Any:
        return Qwen2_5OmniThinkerMultiModalDataParser(
            spatial_merge_size=self.get_hf_config().vision_config.spatial_merge_size,
            target_sr=self.get_feature_extractor().sampling_rate,
            target_channels=self.get_target_channels(),
            expected_hidden_size=self._get_expected_hidden_size(),
            allow_missing_mm_embeddings=self.allow_missing_mm_embeddings,
        )


class Qwen3OmniThinkerProcessor(_RawItemsText, Qwen3OmniMoeThinkerMultiModalProcessor):
    """vLLM's Qwen3-Omni thinker processor, taking raw audio and precomputed image embeddings in one prompt."""


@MULTIMODAL_REGISTRY.register_processor(
    Qwen3OmniThinkerProcessor,
    info=_Qwen3ThinkerInfo,
    dummy_inputs=Qwen3OmniMoeThinkerDummyInputsBuilder,
)
class Qwen3OmniThinker(_ImageEmbedsPerImage, Qwen3OmniMoeThinkerForConditionalGeneration):
    """vLLM's Qwen3-Omni thinker taking precomputed images (each `[tokens, (1 + DeepStack levels) *
    hidden]`, vLLM splits the levels off) beside raw audio. It declares `SupportsEagle3` itself."""


class Gemma3EmbedsProcessor(Gemma3MultiModalProcessor):
    """vLLM's Gemma 3 processor, also taking precomputed image embeddings (the projector's output,
    `[tokens, hidden]` per image), written into the prompt as the HF processor writes an image."""

    def _get_mm_fields_config(self, hf_inputs: Any, hf_processor_mm_kwargs: Any) -> Any:
        fields = super()._get_mm_fields_config(hf_inputs, hf_processor_mm_kwargs)
        return {**fields, "image_embeds": MultiModalFieldConfig.batched("image")}

    def _get_prompt_updates(self, mm_items: Any, hf_processor_mm_kwargs: Any, out_mm_kwargs: Any) -> Any:
        images = mm_items.get_items("image", (ImageEmbeddingItems, ImageProcessorItems))
        if not isinstance(images, ImageEmbeddingItems):
            return super()._get_prompt_updates(mm_items, hf_processor_mm_kwargs, out_mm_kwargs)
        tokenizer = self.info.get_tokenizer()
        vocab = tokenizer.get_vocab()
        boi, eoi, soft = tokenizer.boi_token, tokenizer.eoi_token, tokenizer.image_token

        def replacement(item: int) -> PromptUpdateDetails[list[int]]:
            text = f"\n\n{boi}{soft * images.get_feature_size(item)}{eoi}\n\n"
            ids = tokenizer.encode(text, add_special_tokens=False)
            return PromptUpdateDetails.select_token_id(ids, vocab[soft])  # embeddings go to the soft tokens

        return [PromptReplacement(modality="image", target=[vocab[boi]], replacement=replacement)]


@MULTIMODAL_REGISTRY.register_processor(
    Gemma3EmbedsProcessor, info=Gemma3ProcessingInfo, dummy_inputs=Gemma3DummyInputsBuilder
)
class Gemma3Embeds(Gemma3ForConditionalGeneration):
    """vLLM's Gemma 3, taking precomputed image embeddings (vLLM 0.32's asserts there are none)."""

    def embed_multimodal(self, **kwargs: Any) -> Any:
        embeds = kwargs.pop("image_embeds", None)
        if embeds is not None:
            return list(embeds)  # one [tokens, hidden] tensor per image, as the projector gives them
        return super().embed_multimodal(**kwargs)


class _Done:
    """A finished copy (what the stock connector's CUDA events say when they are done)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def blocks_after_step(blocks: list[int], new: Any, group: int, resumed: bool) -> list[int]:
    """A running request's blocks (of KV cache group `group`) after a scheduler step that gave it
    `new` (`scheduled_cached_reqs.new_block_ids`): all of them anew when it resumed from preemption,
    else those it had and the step's new ones."""
    added = list(new[group]) if new else []
    return added if resumed else blocks + added


@dataclass
class _Streamed:
    """Scheduler side: a running request whose rows are streamed (where to, its hidden-state blocks,
    the positions handed out so far)."""

    path: str
    blocks: list[int]
    done: int = 0


@dataclass
class _Extract:
    """Worker side: append the rows of positions `start:end` (in `blocks`) to `path`."""

    path: str
    blocks: list[int]
    start: int
    end: int


@dataclass
class StreamingMetadata(ExampleHiddenStatesConnectorMetadata):
    """The stock metadata plus this step's row extracts."""

    extracts: list[_Extract] = field(default_factory=list)


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    """vLLM's example hidden-states connector, copying on the CPU, saving only the requests that ask
    (those with `kv_transfer_params`) and leaving no lock file behind for requests that were aborted.

    A request whose `kv_transfer_params` name a `stream_rows_path` also has its rows appended to that
    file while it runs (float32, one row of the captured layer per position, in order): at each step,
    the positions its earlier steps computed (their states are in the cache once a step has run:
    the engine saves after its drafter). The saved file at the end stays the whole record."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock_paths: dict[str, str] = {}  # worker side: lock files of requests not yet saved
        self._streamed: dict[str, _Streamed] = {}  # scheduler side

    # --- scheduler side ---------------------------------------------------------------------------
    def build_connector_meta(self, scheduler_output: Any) -> Any:
        stock = super().build_connector_meta(scheduler_output)
        meta = StreamingMetadata(pending_saves=stock.pending_saves, new_req_filenames=stock.new_req_filenames)
        group = self._cache_kv_group_id
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            transfer = (params.extra_args or {}).get("kv_transfer_params") if params else None
            if not transfer:
                meta.new_req_filenames.pop(new.req_id, None)
                self._request_filenames.pop(new.req_id, None)  # request_finished then saves nothing
            elif "stream_rows_path" in transfer:
                self._streamed[new.req_id] = _Streamed(
                    transfer["stream_rows_path"], list(new.block_ids[group])
                )
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, blocks, computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
        ):
            streamed = self._streamed.get(req_id)
            if streamed is None:
                continue
            streamed.blocks = blocks_after_step(
                streamed.blocks, blocks, group, req_id in cached.resumed_req_ids
            )
            if computed > streamed.done:
                meta.extracts.append(_Extract(streamed.path, list(streamed.blocks), streamed.done, computed))
                streamed.done = computed
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._streamed.pop(request.request_id, None)
        if request.status == RequestStatus.FINISHED_ABORTED:  # nobody reads its states
            self._request_filenames.pop(request.request_id, None)
            return False, None
        return super().request_finished(request, block_ids)

    # --- worker side ------------------------------------------------------------------------------
    def wait_for_save(self) -> None:
        super().wait_for_save()
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, ExampleHiddenStatesConnectorMetadata):
                self._lock_paths.update({r: f + ".lock" for r, f in meta.new_req_filenames.items()})
            if isinstance(meta, StreamingMetadata) and self._is_tp_rank_zero:
                for extract in meta.extracts:
                    self._append_rows(extract)

    def _append_rows(self, extract: _Extract) -> None:
        """Append the rows of `extract`'s positions to its file (one write: a reader sees whole rows
        or none of a step's)."""
        assert self._kv_cache is not None
        positions = torch.arange(extract.start, extract.end)
        blocks = torch.tensor(extract.blocks, dtype=torch.long)[positions // self._block_size]
        slots = blocks * self._block_size + positions % self._block_size
        rows = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), len(slots))
        with open(extract.path, "ab") as f:
            f.write(rows[:, 0].float().cpu().numpy().tobytes())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done = super().get_finished(finished_req_ids)
        for req_id in finished_req_ids:  # finished and not saved: aborted
            lock = self._lock_paths.pop(req_id, None)
            if lock is not None:
                with contextlib.suppress(OSError):
                    os.remove(lock)
        return done

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        self._lock_paths.pop(pending.req_id, None)  # the reader removes it with the file
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size)[None, :] + blocks[:, None] * self._block_size).flatten()
        rows = pending.token_ids.shape[0]
        # Fancy indexing copies: the rows stay valid after the blocks are freed.
        hidden = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), rows).cpu()
        tensors = {"hidden_states": hidden, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))


@dataclass
class _Chunked:
    """Scheduler side, prefill: a prompt prefilled in chunks (its tokens, media hashes, blocks so far)."""

    tokens: list[int]
    media: list[str]
    blocks: list[int]


class HandoffConnector(ExampleConnector):
    """vLLM's file-based KV connector as a prefill → decode hand-off that leaves nothing behind.

    Prefill (`kv_producer`) saves each prompt's KV cache in whole blocks under `shared_storage_path`,
    in a folder named by the hash of the prompt's tokens and media; decode (`kv_consumer`), given the
    same prompt and the first token, loads it instead of computing it (unless its own prefix cache
    holds the prompt), saves nothing itself, and marks the folder taken (`TAKEN`) when its request
    ends. Deleting is the sweep's (`prismserve.executors.handoff.sweep_handoffs`, run by the
    executors): a folder taken a grace period ago, or untouched for the TTL. Each side touches a
    folder as it schedules a request that reuses or loads it, so no sweep deletes one about to be
    read — also when two decodes load the same prompt's. Correctness never rests on the files: a
    decode that finds none computes the prompt itself, and one that cannot read a file it found
    reports the blocks as failed loads, which the engine computes (`kv_load_failure_policy="recompute"`).

    A prompt prefilled in chunks (longer than the engine's token budget per step) is saved when its
    last chunk runs, every block of it: the stock connector saves at a request's first step, whose
    blocks then hold the first chunk only (a hand-off decode's engine dies loading).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._producer = self._kv_transfer_config.is_kv_producer
        self._loaded: dict[str, str] = {}  # decode side: request id -> the folder it loads
        self._chunked: dict[str, _Chunked] = {}  # prefill side: prompts not yet whole
        self._failed: set[int] = set()  # worker side: blocks whose KV could not be loaded

    # --- scheduler side ---------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        folder = self._folder(request)
        with contextlib.suppress(OSError):  # none: nothing to reuse or load
            os.utime(folder)
            if not self._producer:  # taken even when its own prefix cache holds the prompt (nothing loaded)
                self._loaded[request.request_id] = folder
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        meta = super().build_connector_meta(scheduler_output)
        if self._producer:
            self._save_whole_prompts(scheduler_output, meta)
        return meta

    def _save_whole_prompts(self, scheduler_output: Any, meta: Any) -> None:
        """Save chunked prompts once whole: drop the stock connector's save of a first chunk, and save
        the whole prompt in the step that schedules its last chunk."""
        scheduled = scheduler_output.num_scheduled_tokens
        first = {}
        for new in scheduler_output.scheduled_new_reqs:
            tokens = list(new.prompt_token_ids or [])
            if new.num_computed_tokens + scheduled[new.req_id] < len(tokens):
                media = [feature.identifier for feature in new.mm_features]
                self._chunked[new.req_id] = _Chunked(tokens, media, list(new.block_ids[0]))
                first[new.req_id] = torch.tensor(tokens)[: align_to_block_size(len(tokens), self._block_size)]
        if first:
            meta.requests = [
                r
                for r in meta.requests
                if not (r.is_store and any(torch.equal(r.token_ids, t) for t in first.values()))
            ]
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, blocks, computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
        ):
            chunked = self._chunked.get(req_id)
            if chunked is None:
                continue
            chunked.blocks = blocks_after_step(chunked.blocks, blocks, 0, req_id in cached.resumed_req_ids)
            if computed + scheduled[req_id] >= len(chunked.tokens):
                del self._chunked[req_id]
                if not self._found_match_for_prompt(chunked.tokens, chunked.media):  # as the stock one
                    meta.add_request(chunked.tokens, chunked.blocks, self._block_size, True, chunked.media)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._chunked.pop(request.request_id, None)  # aborted before its prompt was whole
        if self._producer:  # the prefill executor marks it taken itself if no decode will load it
            return False, {HANDOFF_FOLDER: self._folder(request)}
        folder = self._loaded.pop(request.request_id, None)
        if folder is not None:
            mark_taken(folder)
        return False, None

    def _folder(self, request: Any) -> str:
        """Where the KV of `request`'s prompt is handed over (as `ExampleConnector` names it): prefill
        saves the prompt's whole blocks, decode (whose prompt has the first token too) loads the
        whole blocks before its last token — the same ones."""
        tokens = list(request.prompt_token_ids or [])
        whole = align_to_block_size(len(tokens) if self._producer else len(tokens) - 1, self._block_size)
        media = [feature.identifier for feature in request.mm_features]
        return str(self._generate_foldername_debug(torch.tensor(tokens)[:whole], media))

    # --- worker side ------------------------------------------------------------------------------
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        try:
            super().start_load_kv(forward_context, **kwargs)
        except OSError:  # a file gone under it: the engine computes those blocks (`kv_load_failure_policy`)
            meta = self._get_connector_metadata()
            for request in getattr(meta, "requests", []):
                if not request.is_store:
                    self._failed.update((request.slot_mapping // self._block_size).unique().tolist())

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed = self._failed, set()
        return failed

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        if self._producer:
            super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
