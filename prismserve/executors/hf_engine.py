"""Continuous batching for LLMs that run on transformers: requests that arrive while others generate
join the batch at the next decoding step; each one streams its tokens and ends on its own.

Why not transformers' own continuous batching: its `ContinuousBatchingManager.add_request` takes
token ids only (no `inputs_embeds`, media or encoder outputs) and positions are 1-D, so neither the
fissioned LLMs (fed embeddings) nor Qwen's M-RoPE can go through it.

How a request runs here:
- Prefill alone, through transformers' own `generate(max_new_tokens=1)`: every family's multimodal
  handling (media placement, M-RoPE `rope_deltas`, Gemma 3's bidirectional image mask, DeepStack)
  is transformers', unchanged. It returns the prompt's KV cache and the first token's logits.
- Decode in one batch: the rows' caches are right-aligned and left-padded to a common length (the
  padding masked out), each row fed its own position (prompt length + its M-RoPE offset + steps).
  The batch is rebuilt only when rows join or leave, not per step.
- Each row keeps its own logits processors (the checkpoint's generation config, its temperature)
  and its own random generator (its seed), so requests never share sampling state.
- The `EngineModel` says how a step is fed and what a request streams: its ids, or what a model
  makes of them (Qwen3-Omni's talker: a frame per id, its code predictor run for all rows at once
  on each row's last hidden state, which the engine keeps when the model asks, `keeps_hidden`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prismserve.models import EngineModel, Generated

log = logging.getLogger(__name__)

_CLOSE = None  # queued to stop the engine thread


@dataclass
class Sequence:
    """One request in the engine: what it asked for, and its state once prefilled."""

    inputs: dict[str, Any]
    max_tokens: int
    temperature: float
    seed: int | None
    on_token: Callable[[Any], object] | None
    should_stop: Callable[[], bool] | None
    with_logits: bool
    with_hidden: bool
    future: concurrent.futures.Future[Generated] = field(default_factory=concurrent.futures.Future)
    tokens: list[int] = field(default_factory=list)
    logits: list[Any] = field(default_factory=list)
    hidden: list[Any] = field(default_factory=list)
    processors: Any = None
    generator: Any = None
    history: Any = None  # prompt + generated ids, for processors that look back (repetition penalty)
    length: int = 0  # tokens in its KV cache
    position: int = 0  # position id of the next token it is fed
    cache: Any = None  # its own cache until it joins the batch
    last_hidden: Any = None  # [1, hidden]: the last layer at its last position (`keeps_hidden`)

    def emit(self, item: Any) -> None:
        """Hand `item` (an id, or what the model streams) to the caller's `on_token`; a callback that
        fails ends this request alone."""
        if self.on_token is None:
            return
        try:
            self.on_token(item)
        except Exception as exc:  # noqa: BLE001 - e.g. its consumer went away
            self.finish(exc)

    def finish(self, error: BaseException | None = None) -> None:
        """Hand the result (or `error`) to the caller, once."""
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
            return
        import torch

        logits = torch.cat(self.logits).numpy() if self.with_logits else None
        self.future.set_result(
            Generated(self.tokens, logits, tuple(self.hidden) if self.with_hidden else None)
        )


class HFEngine:
    """Generates for every submitted request at once on one transformers model (a worker thread owns
    the model; `submit` is safe from any thread). `model` is an adapter (its LLM) or an EngineModel."""

    def __init__(self, model: Any, max_batch: int = 32) -> None:
        self.model = model if isinstance(model, EngineModel) else EngineModel.of(model)
        self.llm = self.model.module
        self.max_batch = max(1, max_batch)
        self.end_ids = self.model.end_ids
        self.peak_batch = 0  # the most rows decoded together so far (tests and benchmarks read it)
        self._queue: queue.SimpleQueue[Sequence | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
        self._thread.start()

    def submit(
        self,
        inputs: dict[str, Any],
        max_tokens: int,
        *,
        temperature: float = 0.0,
        seed: int | None = None,
        on_token: Callable[[Any], object] | None = None,
        should_stop: Callable[[], bool] | None = None,
        with_logits: bool = False,
        with_hidden: bool = False,
    ) -> concurrent.futures.Future[Generated]:
        """The generation of one request, as `Adapter.generate` returns it; `on_token` is called from
        the engine thread with each id (or what the model streams instead: `EngineModel.stream`),
        `should_stop` ends the request at its next step."""
        sequence = Sequence(
            inputs, max_tokens, temperature, seed, on_token, should_stop, with_logits, with_hidden
        )
        self._queue.put(sequence)
        return sequence.future

    def close(self) -> None:
        """Stop the engine thread; requests still running fail."""
        self._queue.put(_CLOSE)
        self._thread.join(timeout=60)

    # --- the engine thread ------------------------------------------------------------------------
    def _serve(self) -> None:
        """Admit, prefill, decode a step, repeat; block only when nothing is running."""
        import torch

        batch = Batch()
        waiting: list[Sequence] = []
        with torch.inference_mode():
            while True:
                if not self._admit(waiting, block=not batch.rows and not waiting):
                    for sequence in [*batch.rows, *waiting]:
                        sequence.finish(RuntimeError("the engine was closed"))
                    return
                room = self.max_batch - len(batch.rows)
                joining, waiting = waiting[:room], waiting[room:]
                prefilled = [s for s in joining if self._prefill(s)]
                try:
                    batch.rebuild([s for s in batch.rows if not s.future.done()], prefilled)
                    self.peak_batch = max(self.peak_batch, len(batch.rows))
                    if batch.rows:
                        self._step(batch)
                except Exception as exc:  # noqa: BLE001 - a failed batch step fails its rows, not the engine
                    log.exception("decode step failed")
                    for sequence in batch.rows:
                        sequence.finish(exc)
                    batch = Batch()

    def _admit(self, waiting: list[Sequence], block: bool) -> bool:
        """Move newly submitted requests to `waiting`; False once the engine is closed."""
        try:
            item = self._queue.get(block=block)
            while True:
                if item is _CLOSE:
                    return False
                waiting.append(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            return True

    def _prefill(self, sequence: Sequence) -> bool:
        """Run the prompt alone through transformers' `generate` and choose the first token; True
        if the request goes on decoding."""
        try:
            inputs = sequence.inputs
            out = self.llm.generate(
                **inputs,
                max_new_tokens=1,
                do_sample=False,
                output_logits=True,
                output_hidden_states=sequence.with_hidden or self.model.keeps_hidden,
                return_dict_in_generate=True,
            )
            sequence.cache = out.past_key_values
            sequence.length = inputs["input_ids" if "input_ids" in inputs else "inputs_embeds"].shape[1]
            sequence.position = sequence.length + self.model.position_offset()
            sequence.history = out.sequences[:, :-1]  # the ids `generate` saw: none if fed embeddings alone
            sequence.processors = self._processors(sequence)
            sequence.generator = self._generator(sequence)
            if sequence.with_hidden:
                sequence.hidden.append(out.hidden_states[0])
            if self.model.keeps_hidden:
                sequence.last_hidden = self.model.last_hidden(out.hidden_states[0])
            return self._take(sequence, out.logits[0])
        except Exception as exc:  # noqa: BLE001 - this request's error is its own
            sequence.finish(exc)
            return False

    def _processors(self, sequence: Sequence) -> Any:
        """The logits processors `generate` would use for this request."""
        return self.llm._get_logits_processor(
            generation_config=self.model.generation_config(sequence.temperature),
            input_ids_seq_length=sequence.history.shape[1],
            device=sequence.history.device,
            model_kwargs={},
        )

    def _generator(self, sequence: Sequence) -> Any:
        """A random generator of the request's own (None when greedy)."""
        import torch

        if sequence.temperature <= 0:
            return None
        generator = torch.Generator(device=sequence.history.device)
        if sequence.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sequence.seed)
        return generator

    def _step(self, batch: Batch) -> None:
        """One decoding step for every row: feed each its last token, take its next one."""
        import torch

        rows = batch.rows
        device = batch.mask.device
        ids = torch.tensor([[s.tokens[-1]] for s in rows], device=device)
        positions = torch.tensor([[s.position] for s in rows], device=device)
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(rows), 1)], dim=1)
        out = self.llm(
            **self.model.step_inputs(rows, ids),
            attention_mask=batch.mask,
            position_ids=positions,
            past_key_values=batch.cache,
            use_cache=True,
            output_hidden_states=self.model.keeps_hidden or any(s.with_hidden for s in rows),
        )
        logits = out.logits[:, -1, :]
        last = self.model.last_hidden(out.hidden_states) if self.model.keeps_hidden else None
        for i, sequence in enumerate(rows):
            sequence.length += 1
            sequence.position += 1
            if sequence.with_hidden:
                sequence.hidden.append(tuple(h[i : i + 1] for h in out.hidden_states))
            if last is not None:
                sequence.last_hidden = last[i : i + 1]
            try:
                self._take(sequence, logits[i : i + 1])
            except Exception as exc:  # noqa: BLE001 - e.g. its logits processors failed: its own error
                sequence.finish(exc)

    def _take(self, sequence: Sequence, logits: Any) -> bool:
        """Choose the request's next token from its raw `logits` ([1, vocab]), stream it, and
        finish the request when it is done; True while it goes on."""
        import torch

        logits = logits.float()
        if sequence.with_logits:
            sequence.logits.append(logits.cpu())
        scores = sequence.processors(sequence.history, logits) if sequence.processors else logits
        if sequence.generator is None:
            token = int(scores.argmax(-1))
        else:
            probs = torch.softmax(scores, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=sequence.generator))
        sequence.tokens.append(token)
        if sequence.processors:
            sequence.history = torch.cat([sequence.history, sequence.history.new_tensor([[token]])], 1)
        self.model.stream(sequence, token)
        done = (
            token in self.end_ids
            or len(sequence.tokens) >= sequence.max_tokens
            or (sequence.should_stop is not None and sequence.should_stop())
        )
        if done:
            sequence.finish()
        return not sequence.future.done()  # a failed callback ended it too


class Batch:
    """The decoding batch: its rows, their KV cache (left-padded to a common length, right-aligned)
    and the attention mask over the cached positions (0 on padding)."""

    def __init__(self) -> None:
        self.rows: list[Sequence] = []
        self.cache: Any = None
        self.mask: Any = None

    def rebuild(self, staying: list[Sequence], joining: list[Sequence]) -> None:
        """Keep `staying` (rows of this batch) and add `joining` (prefilled alone); a no-op when
        nothing changed, so a steady batch costs nothing here."""
        if not joining and len(staying) == len(self.rows):
            return
        if not staying and not joining:
            self.rows, self.cache, self.mask = [], None, None
            return
        import torch

        index = {id(s): i for i, s in enumerate(self.rows)}
        rows = [*staying, *joining]
        length = max(s.length for s in rows)
        template = self.cache if self.cache is not None else joining[0].cache
        for layer_index, layer in enumerate(template.layers):
            keys, values = [], []
            for sequence in rows:
                if id(sequence) in index:
                    source, row = self.cache.layers[layer_index], index[id(sequence)]
                else:
                    source, row = sequence.cache.layers[layer_index], 0
                kept = min(sequence.length, source.keys.shape[-2])  # a sliding layer keeps a window
                keys.append(source.keys[row : row + 1, :, source.keys.shape[-2] - kept :])
                values.append(source.values[row : row + 1, :, source.values.shape[-2] - kept :])
            layer.keys, layer.values = _left_padded(keys), _left_padded(values)
            if hasattr(layer, "cumulative_length"):  # a sliding-window layer counts padded positions
                layer.cumulative_length = length
        device = rows[0].history.device
        self.mask = torch.stack(
            [(torch.arange(length, device=device) >= length - s.length).long() for s in rows]
        )
        for sequence in joining:
            sequence.cache = None  # its rows now live in the batch cache
        self.rows, self.cache = rows, template


def _left_padded(parts: list[Any]) -> Any:
    """`[1, heads, n_i, dim]` tensors zero-padded on the left to the longest and stacked on dim 0."""
    import torch

    longest = max(p.shape[-2] for p in parts)
    return torch.cat(
        [
            torch.nn.functional.pad(p, (0, 0, longest - p.shape[-2], 0)) if p.shape[-2] < longest else p
            for p in parts
        ]
    )
