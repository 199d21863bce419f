"""Out-of-tree pieces that let vLLM 0.32 hand a Qwen2.5-Omni talker the thinker's hidden states.

Imported only in the vLLM environment (by vLLM itself: the plugin in `vllm_plugin.py` registers
`OmniThinker` by name, and the engine arguments name `CPUHiddenStatesConnector`'s module).

How the hidden states come out, with no fork of vLLM: the `extract_hidden_states` speculative method
caches the last decoder layer's output (before the final norm) of every position a request fed the
model, and a hidden-states KV connector writes a finished request's rows to a safetensors file. Two
gaps in vLLM 0.32 are filled here:
- its Omni thinker class does not declare `SupportsEagle3` (its decoder can emit auxiliary hidden
  states, the class does not say so), it hands precomputed image embeddings to the model as one
  tensor instead of one per image (`OmniThinker`), and its processor fails on a prompt with both
  precomputed image embeddings and raw audio (`OmniThinkerProcessor`);
- the stock `ExampleHiddenStatesConnector` copies with CUDA streams and pinned memory, which kills a
  CPU engine at the first finished request, and it saves every request (`CPUHiddenStatesConnector`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from functools import partial
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    ExampleHiddenStatesConnectorMetadata,
    PendingSave,
    extract_from_kv_cache,
)
from vllm.model_executor.models.interfaces import SupportsEagle3
from vllm.model_executor.models.qwen2_5_omni_thinker import (
    Qwen2_5OmniThinkerDummyInputsBuilder,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen2_5OmniThinkerMultiModalProcessor,
    Qwen2_5OmniThinkerProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.v1.request import RequestStatus


class OmniThinkerProcessor(Qwen2_5OmniThinkerMultiModalProcessor):
    """vLLM's Omni thinker processor, taking raw audio and precomputed image embeddings in one prompt."""

    def _get_hf_mm_inputs(self, mm_items: Any, hf_kwargs: Any) -> Any:
        inputs = super()._get_hf_mm_inputs(mm_items, hf_kwargs)
        if "text" in inputs.hf_data and not inputs.hf_kwargs.get("use_audio_in_video"):
            # The HF processor sees only raw items (audio); vLLM 0.32 writes a placeholder for the
            # embedding items too, which the HF processor then fails to expand (no grid for them).
            raw = {m: len(items) for m, items in mm_items.items() if items and items.get_processor_data()}
            inputs.hf_data["text"] = self._get_hf_mm_text(raw)
        return inputs


@MULTIMODAL_REGISTRY.register_processor(
    OmniThinkerProcessor,
    info=Qwen2_5OmniThinkerProcessingInfo,
    dummy_inputs=Qwen2_5OmniThinkerDummyInputsBuilder,
)
class OmniThinker(Qwen2_5OmniThinkerForConditionalGeneration, SupportsEagle3):
    """vLLM's Qwen2.5-Omni thinker, able to emit its last layer's hidden states (EAGLE-3's auxiliary
    states, which `extract_hidden_states` caches), and taking several precomputed images per prompt,
    beside raw audio."""

    def _process_image_input(self, image_input: Any) -> tuple[torch.Tensor, ...]:
        if image_input["type"] != "image_embeds":
            return super()._process_image_input(image_input)
        # vLLM 0.32's thinker returns the embeddings of all images as one tensor, which its caller
        # then iterates row by row; one tensor per image is what it must return (as Qwen2.5-VL's does).
        embeds = image_input["image_embeds"]
        if isinstance(embeds, (list, tuple)):
            return tuple(e.type(self.visual.dtype) for e in embeds)
        merge = self.config.vision_config.spatial_merge_size
        sizes = (image_input["image_grid_thw"].prod(-1) // merge // merge).tolist()
        return embeds.type(self.visual.dtype).split(sizes)


class _Done:
    """A finished copy (what the stock connector's CUDA events say when they are done)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    """vLLM's example hidden-states connector, copying on the CPU, saving only the requests that ask
    (those with `kv_transfer_params`) and leaving no lock file behind for requests that were aborted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock_paths: dict[str, str] = {}  # worker side: lock files of requests not yet saved

    # --- scheduler side ---------------------------------------------------------------------------
    def build_connector_meta(self, scheduler_output: Any) -> Any:
        meta = super().build_connector_meta(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            if not (params and params.extra_args and params.extra_args.get("kv_transfer_params")):
                meta.new_req_filenames.pop(new.req_id, None)
                self._request_filenames.pop(new.req_id, None)  # request_finished then saves nothing
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
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
