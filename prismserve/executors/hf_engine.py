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
- Each row keeps its own logits processors (the checkpoint's generation config under the request's
  `Sampling`: temperature, top_p, top_k, min_p, repetition penalty; OpenAI's presence and frequency
  penalties) and its own random generator (its seed), so requests never share sampling state; a
  reply held to a JSON Schema also has its grammar (`executors/grammar.py`), which masks the logits.
  Log-probabilities, when asked for, are of the raw logits (as vLLM reports them by default).
- `max_tokens` None generates up to the model's context (and a larger one stops there: "length"); a
  prompt that fills the context fails as the request's fault.
- The `EngineModel` says how a step is fed and what a request streams: its ids, or what a model
  makes of them (Qwen3-Omni's talker: a frame per id, its code predictor run for all rows at once
  on each row's last hidden state, which the engine keeps when the model asks, `keeps_hidden`).
- A request fed more than its tokens (an Omni talker, fed the thinker's reply row by row while the
  thinker still generates: its `ReplyFeed`) waits while its next row has not come: the others
  step on; its own slot in that step is masked out (a hole in its cache, dropped when the batch is
  next rebuilt). When every row waits, the engine sleeps until a feed wakes it.
- `on_states` hands a caller each forward's hidden states for its request as they are computed (an
  Omni thinker builds its talker's conditioning from them while it generates).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prismserve.executors.grammar import GrammarVocabulary, JsonGrammar
from prismserve.models import EngineModel, Generated
from prismserve.models.conditioning import ReplyFeed
from prismserve.protocol.chat import Sampling
from prismserve.task import ContextLengthError, InvalidInputError

log = logging.getLogger(__name__)

_CLOSE = None  # queued to stop the engine thread
_WAKE = object()  # queued when a waiting request's feed has more for it


@dataclass
class Sequence:
    """One request in the engine: what it asked for, and its state once prefilled."""

    inputs: dict[str, Any]
    max_tokens: int | None
    sampling: Sampling
    on_token: Callable[[Any], object] | None
    should_stop: Callable[[], bool] | None
    with_logits: bool
    with_hidden: bool
    on_states: Callable[[Any], object] | None = None
    feed: ReplyFeed | None = None
    on_logprobs: Callable[[Any], object] | None = None
    future: concurrent.futures.Future[Generated] = field(default_factory=concurrent.futures.Future)
    tokens: list[int] = field(default_factory=list)
    logits: list[Any] = field(default_factory=list)
    hidden: list[Any] = field(default_factory=list)
    processors: Any = None
    generator: Any = None
    history: Any = None  # prompt + generated ids, for processors that look back (repetition penalty)
    grammar: JsonGrammar | None = None  # the JSON Schema its reply follows (`Sampling.json_schema`)
    length: int = 0  # tokens in its KV cache
    prompt_tokens: int = 0
    finish_reason: str = "stop"  # "length" once cut by max_tokens or the context
    position: int = 0  # position id of the next token it is fed
    cache: Any = None  # its own cache until it joins the batch
    last_hidden: Any = None  # [1, hidden]: the last layer at its last position (`keeps_hidden`)

    def emit(self, item: Any) -> None:
        """Hand `item` (an id, or what the model streams) to the caller's `on_token`; a callback that
        fails ends this request alone."""
        self._call(self.on_token, item)

    def states(self, hidden_states: Any) -> None:
        """Hand one forward's hidden states of this request (per layer `[1, positions, hidden]`) to
        the caller's `on_states`."""
        self._call(self.on_states, hidden_states)

    def _call(self, callback: Callable[[Any], object] | None, item: Any) -> None:
        if callback is None:
            return
        try:
            callback(item)
        except Exception as exc:  # noqa: BLE001 - e.g. its consumer went away
            self.finish(exc)

    def ready(self) -> bool:
        """Whether it can take its next step: what its feed gives that step has come (or it stops)."""
        return (
            self.feed is None
            or self.feed.ready(len(self.tokens) - 1)
            or (self.should_stop is not None and self.should_stop())
        )

    def finish(self, error: BaseException | None = None) -> None:
        """Hand the result (or `error`) to the caller, once."""
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
            return
        import torch

        logits = torch.cat(self.logits).numpy() if self.with_logits else None
        hidden = tuple(self.hidden) if self.with_hidden else None
        self.future.set_result(Generated(self.tokens, logits, hidden, self.finish_reason, self.prompt_tokens))


class HFEngine:
    """Generates for every submitted request at once on one transformers model (a worker thread owns
    the model; `submit` is safe from any thread). `model` is an adapter (its LLM) or an EngineModel."""

    def __init__(self, model: Any, max_batch: int = 32) -> None:
        self.model = model if isinstance(model, EngineModel) else EngineModel.of(model)
        self.llm = self.model.module
        self.max_batch = max(1, max_batch)
        self.end_ids = self.model.end_ids
        self.peak_batch = 0  # the most rows decoded together so far (tests and benchmarks read it)
        self._vocabulary: GrammarVocabulary | None = None  # llguidance's, once a JSON reply is asked for
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()  # requests, _WAKE, _CLOSE
        self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
        self._thread.start()

    def submit(
        self,
        inputs: dict[str, Any],
        max_tokens: int | None,
        *,
        temperature: float | None = 0.0,
        seed: int | None = None,
        sampling: Sampling | None = None,
        on_token: Callable[[Any], object] | None = None,
        should_stop: Callable[[], bool] | None = None,
        with_logits: bool = False,
        with_hidden: bool = False,
        on_states: Callable[[Any], object] | None = None,
        feed: ReplyFeed | None = None,
        on_logprobs: Callable[[Any], object] | None = None,
    ) -> concurrent.futures.Future[Generated]:
        """The generation of one request, as `Adapter.generate` returns it; `on_token` is called from
        the engine thread with each id (or what the model streams instead: `EngineModel.stream`),
        `on_states` with each forward's hidden states of the request (the prompt's, then one
        position per step), `should_stop` ends the request at its next step. A talker's `feed`
        gives the reply row of each decoding step (the request waits for rows yet to come).

        `sampling` (a request's, its temperature and seed included) replaces `temperature` and
        `seed`; with its `top_logprobs` set, `on_logprobs` gets `(logprob, [(id, logprob), ...])`
        of each token just before `on_token` does."""
        sequence = Sequence(
            inputs,
            max_tokens,
            sampling if sampling is not None else Sampling(temperature=temperature, seed=seed),
            on_token,
            should_stop,
            with_logits,
            with_hidden,
            on_states,
            feed,
            on_logprobs,
        )
        if feed is not None:
            feed.attach(self.wake)
        self._queue.put(sequence)
        return sequence.future

    def wake(self) -> None:
        """Tell the engine that a waiting request may go on (its feed has more)."""
        self._queue.put(_WAKE)

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
        stepped = True
        with torch.inference_mode():
            while True:
                if not self._admit(waiting, block=not (batch.rows and stepped) and not waiting):
                    for sequence in [*batch.rows, *waiting]:
                        sequence.finish(RuntimeError("the engine was closed"))
                    return
                room = self.max_batch - len(batch.rows)
                joining, waiting = waiting[:room], waiting[room:]
                prefilled = [s for s in joining if self._prefill(s)]
                try:
                    batch.rebuild([s for s in batch.rows if not s.future.done()], prefilled)
                    self.peak_batch = max(self.peak_batch, len(batch.rows))
                    stepped = bool(batch.rows) and self._step(batch)
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
                if item is not _WAKE:
                    waiting.append(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            return True

    def _prefill(self, sequence: Sequence) -> bool:
        """Run the prompt alone through transformers' `generate` and choose the first token; True
        if the request goes on decoding."""
        try:
            inputs = sequence.inputs
            sequence.length = inputs["input_ids" if "input_ids" in inputs else "inputs_embeds"].shape[1]
            sequence.prompt_tokens = sequence.length
            sequence.max_tokens = self._room(sequence)
            out = self.llm.generate(
                **inputs,
                max_new_tokens=1,
                do_sample=False,
                output_logits=True,
                output_hidden_states=self._wants_hidden(sequence),
                return_dict_in_generate=True,
            )
            sequence.cache = out.past_key_values
            sequence.position = sequence.length + self.model.position_offset()
            sequence.history = out.sequences[:, :-1]  # the ids `generate` saw: none if fed embeddings alone
            config = self.model.generation_config(sequence.sampling)
            sequence.processors = self._processors(sequence, config)
            sequence.grammar = self._grammar(sequence, out.logits[0].shape[-1])
            sequence.generator = self._generator(sequence) if config.do_sample else None
            if sequence.with_hidden:
                sequence.hidden.append(out.hidden_states[0])
            if sequence.on_states is not None:
                sequence.states(out.hidden_states[0])
            if self.model.keeps_hidden:
                sequence.last_hidden = self.model.last_hidden(out.hidden_states[0])
            return self._take(sequence, out.logits[0])
        except Exception as exc:  # noqa: BLE001 - this request's error is its own
            sequence.finish(exc)
            return False

    def _room(self, sequence: Sequence) -> int:
        """How many tokens the request may generate: its `max_tokens` (None: the generation config's
        `max_new_tokens`, else as many as fit), at most what the model's context leaves after the
        prompt (an InvalidInputError if that is nothing)."""
        wanted = sequence.max_tokens
        if wanted is None:
            wanted = getattr(self.llm.generation_config, "max_new_tokens", None)
        context = self.model.context_length()
        if context is None:
            if wanted is None:
                raise InvalidInputError("this model's config gives no context length: set max_tokens")
            return wanted
        room = context - sequence.length
        if room < 1:
            raise ContextLengthError(
                f"this model's context is {context} tokens and the prompt has {sequence.length}: "
                "send a shorter prompt"
            )
        return room if wanted is None else min(wanted, room)

    def _processors(self, sequence: Sequence, config: Any) -> Any:
        """The logits processors `generate` would use for this request under `config`, and OpenAI's
        presence and frequency penalties."""
        processors = self.llm._get_logits_processor(
            generation_config=config,
            input_ids_seq_length=sequence.history.shape[1],
            device=sequence.history.device,
            model_kwargs={},
        )
        sampling = sequence.sampling
        if sampling.presence_penalty or sampling.frequency_penalty:
            processors.insert(
                0, Penalties(sampling.presence_penalty, sampling.frequency_penalty, sequence.history.shape[1])
            )
        return processors

    def _grammar(self, sequence: Sequence, vocab_size: int) -> JsonGrammar | None:
        """The grammar of a request whose reply must follow a JSON Schema (None: any reply)."""
        schema = sequence.sampling.json_schema
        if schema is None:
            return None
        if self.model.tokenizer is None:
            raise InvalidInputError("this model writes no text: it takes no json_schema")
        if self._vocabulary is None:
            self._vocabulary = GrammarVocabulary(self.model.tokenizer, vocab_size, self.end_ids)
        return self._vocabulary.json(schema)

    def _generator(self, sequence: Sequence) -> Any:
        """A random generator of the request's own, from its seed."""
        import torch

        generator = torch.Generator(device=sequence.history.device)
        if sequence.sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sequence.sampling.seed)
        return generator

    def _wants_hidden(self, sequence: Sequence) -> bool:
        return sequence.with_hidden or sequence.on_states is not None or self.model.keeps_hidden

    def _step(self, batch: Batch) -> bool:
        """One decoding step for every row that is ready: feed each its last token, take its next
        one; False when every row waits."""
        import torch

        rows = batch.rows
        ready = [s.ready() for s in rows]
        if not any(ready):
            return False
        fed = [i for i, r in enumerate(ready) if r]
        device = batch.mask.device
        ids = torch.tensor([[rows[i].tokens[-1]] for i in fed], device=device)
        inputs = self.model.step_inputs([rows[i] for i in fed], ids)
        if len(fed) < len(rows):  # the waiting rows get zeros, masked out
            inputs = _scattered(inputs, fed, len(rows))
            batch.holes = True
        positions = torch.tensor([[s.position] for s in rows], device=device)
        column = torch.tensor(ready, dtype=batch.mask.dtype, device=device)[:, None]
        batch.mask = torch.cat([batch.mask, column], dim=1)
        out = self.llm(
            **inputs,
            attention_mask=batch.mask,
            position_ids=positions,
            past_key_values=batch.cache,
            use_cache=True,
            output_hidden_states=any(self._wants_hidden(rows[i]) for i in fed),
        )
        logits = out.logits[:, -1, :]
        last = self.model.last_hidden(out.hidden_states) if self.model.keeps_hidden else None
        for i in fed:
            sequence = rows[i]
            sequence.length += 1
            sequence.position += 1
            if sequence.with_hidden or sequence.on_states is not None:
                states = tuple(h[i : i + 1] for h in out.hidden_states)
                if sequence.with_hidden:
                    sequence.hidden.append(states)
                sequence.states(states)
            if last is not None:
                sequence.last_hidden = last[i : i + 1]
            if sequence.future.done():  # its states callback failed
                continue
            try:
                self._take(sequence, logits[i : i + 1])
            except Exception as exc:  # noqa: BLE001 - e.g. its logits processors failed: its own error
                sequence.finish(exc)
        return True

    def _take(self, sequence: Sequence, logits: Any) -> bool:
        """Choose the request's next token from its raw `logits` ([1, vocab]), stream it, and
        finish the request when it is done; True while it goes on."""
        import torch

        logits = logits.float()
        if sequence.with_logits:
            sequence.logits.append(logits.cpu())
        scores = sequence.processors(sequence.history, logits) if sequence.processors else logits
        if sequence.grammar is not None:
            scores = sequence.grammar.allowed(scores.clone() if scores is logits else scores)
        if sequence.generator is None:
            token = int(scores.argmax(-1))
        else:
            probs = torch.softmax(scores, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=sequence.generator))
        sequence.tokens.append(token)
        if sequence.grammar is not None:
            sequence.grammar.take(token)
        if sequence.processors:
            sequence.history = torch.cat([sequence.history, sequence.history.new_tensor([[token]])], 1)
        if sequence.sampling.top_logprobs is not None:
            sequence._call(sequence.on_logprobs, _logprobs(logits, token, sequence.sampling.top_logprobs))
        self.model.stream(sequence, token)
        assert sequence.max_tokens is not None  # `_room` set it at the prefill
        if token not in self.end_ids and len(sequence.tokens) >= sequence.max_tokens:
            sequence.finish_reason = "length"
        done = (
            token in self.end_ids
            or len(sequence.tokens) >= sequence.max_tokens
            or (sequence.should_stop is not None and sequence.should_stop())
        )
        if done:
            sequence.finish()
        return not sequence.future.done()  # a failed callback ended it too


def _logprobs(logits: Any, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-probability under the raw `logits` ([1, vocab]) and the `top` most
    likely tokens' (id, log-probability)."""
    import torch

    logprobs = torch.log_softmax(logits[0], dim=-1)
    best = torch.topk(logprobs, top) if top else None
    alternatives = list(zip(best.indices.tolist(), best.values.tolist(), strict=True)) if best else []
    return float(logprobs[token]), alternatives


class Penalties:
    """OpenAI's presence and frequency penalties (vLLM's too), a logits processor: each token already
    generated loses `presence` once and `frequency` per time it came. The counts are kept up to date
    token by token, so a step costs the same late in a reply as early."""

    def __init__(self, presence: float, frequency: float, prompt_length: int) -> None:
        self.presence, self.frequency = presence, frequency
        self.seen = prompt_length  # ids of `input_ids` already counted (the prompt is not)
        self.counts: Any = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.counts is None:
            self.counts = torch.zeros(scores.shape[-1], dtype=scores.dtype, device=scores.device)
        for token in input_ids[0, self.seen :].tolist():
            self.counts[token] += 1
        self.seen = input_ids.shape[1]
        return scores - self.frequency * self.counts - self.presence * (self.counts > 0).to(scores.dtype)


class Batch:
    """The decoding batch: its rows, their KV cache (left-padded to a common length, right-aligned)
    and the attention mask over the cached positions (0 on padding, and on the holes of steps a
    row waited through: `holes`)."""

    def __init__(self) -> None:
        self.rows: list[Sequence] = []
        self.cache: Any = None
        self.mask: Any = None
        self.holes = False

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
                kept = self._kept(
                    source.keys.shape[-2], sequence.length, row if id(sequence) in index else None
                )
                keys.append(source.keys[row : row + 1, :, kept])
                values.append(source.values[row : row + 1, :, kept])
            layer.keys, layer.values = _left_padded(keys), _left_padded(values)
            if hasattr(layer, "cumulative_length"):  # a sliding-window layer counts padded positions
                layer.cumulative_length = length
        device = rows[0].history.device
        self.mask = torch.stack(
            [(torch.arange(length, device=device) >= length - s.length).long() for s in rows]
        )
        for sequence in joining:
            sequence.cache = None  # its rows now live in the batch cache
        self.rows, self.cache, self.holes = rows, template, False

    def _kept(self, cached: int, length: int, row: int | None) -> Any:
        """Which of a row's `cached` positions hold its `length` tokens: the last ones (a sliding
        layer keeps a window of them), or for a row of this batch with holes, the ones its mask keeps."""
        if row is None or not self.holes:
            return slice(cached - min(length, cached), None)
        kept = self.mask[row].nonzero().flatten() - (self.mask.shape[1] - cached)
        return kept[kept >= 0]


def _scattered(inputs: dict[str, Any], rows: list[int], size: int) -> dict[str, Any]:
    """Step inputs made for `rows` (of a batch of `size`) laid out for the whole batch: tensors of
    one entry per row put at their rows, zeros elsewhere; other inputs as they are."""
    import torch

    out = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.shape[:1] == (len(rows),):
            full = value.new_zeros((size, *value.shape[1:]))
            full[rows] = value
            value = full
        out[name] = value
    return out


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
