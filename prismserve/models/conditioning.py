"""An Omni talker's conditioning as a stream: the thinker hands it over while it generates, so the
talker starts on the thinker's first tokens instead of waiting for its whole reply.

The stream's items are dicts of numpy arrays. The first holds what the talker's prefill is built
from (the family's `talker_prompt`), `fill_embeds` (`[1, hidden]`: the row the talker is fed once
the reply is spent) and the reply rows known so far (`reply_embeds`, `[rows, hidden]`); each later
item holds more reply rows, one per token the thinker fed itself, and the last the rows that end
the reply. `merged(items)` is the whole conditioning, the one transformers' `generate` would use.

The thinker side is a family's `ConditioningBuilder`, fed the states of each position the thinker
computed (any engine: transformers step by step, vLLM from the states it saved); the talker side a
`ReplyFeed` that the batching engine reads one row per decoding step: a request whose next row has
not come yet waits, the others go on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from prismserve.models.base import as_numpy

REPLY = "reply_embeds"
FILL = "fill_embeds"

Item = dict[str, np.ndarray]


def merged(items: list[Item]) -> Item:
    """The whole conditioning from a stream's items: the first, with every item's reply rows."""
    if not items:
        raise ValueError("the thinker sent no talker conditioning (was speech asked of it?)")
    return {**items[0], REPLY: np.concatenate([item[REPLY] for item in items])}


class ConditioningBuilder(ABC):
    """One request's talker conditioning, built from what its thinker computed at each position it
    was fed (the prompt, then each generated token but the last) and handed to `emit` item by item
    as soon as each is complete: the prompt once the first reply row is known, a reply row for each
    token fed after it, the end rows at `finish`.

    Reply rows are "text rows": the thinker's states at the reply's text positions, in order. A
    family says where they start (`prompt_rows`), what a fed token's row is (`text_row`), what the
    first item holds (`first_item`, given the first text row) and how the reply ends (`end_rows`)."""

    def __init__(
        self, prompt_ids: list[int], emit: Callable[[Item], object], extra: Item | None = None
    ) -> None:
        self.prompt_ids = prompt_ids
        self.generated: list[int] = []
        self._emit = emit
        self._extra = extra or {}  # arrays the talker's prompt also needs (the media's positions)
        self._prompted = False
        self._started = False

    def add_token(self, token: int) -> None:
        """A token the thinker generated (in order)."""
        self.generated.append(token)

    def add_states(self, embeds: Any, hidden: Any) -> None:
        """`[k, hidden]` input embeddings and hidden states (the layer the talker reads) of the next
        k positions the thinker fed: the whole prompt first, then generated tokens."""
        if not self._prompted:
            self._prompted = True
            rows = list(self.prompt_rows(embeds, hidden))
        else:
            rows = [self.text_row(e, h) for e, h in zip(embeds, hidden, strict=True)]
        if self._started:
            if rows:
                self._emit({REPLY: _stacked(rows)})
        elif rows:
            self._start(rows[0], rows[1:])

    def finish(self) -> None:
        """The thinker is done: the rows that end the reply (after the first item, if none went yet)."""
        import torch

        with torch.inference_mode():
            if not self._started:
                self._start(None, [])
            if ends := list(self.end_rows()):
                self._emit({REPLY: _stacked(ends)})

    def _start(self, first: Any, rest: list[Any]) -> None:
        self._started = True
        item = {**self.first_item(first), **self._extra}
        item[REPLY] = _stacked(rest) if rest else np.zeros((0, item[FILL].shape[-1]), dtype=np.float32)
        self._emit(item)

    @abstractmethod
    def prompt_rows(self, embeds: Any, hidden: Any) -> Any:
        """Keep what the first item needs of the prompt's `[prompt, hidden]` states; the text rows
        among them (usually none: the reply starts after the prompt)."""

    @abstractmethod
    def text_row(self, embed: Any, hidden: Any) -> Any:
        """The reply row (`[hidden]`) of a generated token the thinker fed itself."""

    @abstractmethod
    def first_item(self, first: Any) -> Item:
        """The talker's prompt: from the prompt's states and the first text row (`[hidden]`, or
        None when the reply has none), with `FILL`."""

    @abstractmethod
    def end_rows(self) -> Any:
        """The rows (`[hidden]` each) after the last text row."""


class ReplyFeed:
    """The reply rows of one talker request as they arrive (`append` from any thread), read by the
    engine one per decoding step (`at`); after the last row (`close`) the fill row is fed for good."""

    def __init__(self, rows: list[Any], fill: Any) -> None:
        self._rows = list(rows)
        self._fill = fill
        self._done = False
        self._wake: Callable[[], object] = lambda: None

    def attach(self, wake: Callable[[], object]) -> None:
        """Call `wake` whenever rows arrive or the feed closes (the engine waits for them)."""
        self._wake = wake

    def append(self, rows: list[Any]) -> None:
        """More reply rows, in order."""
        self._rows.extend(rows)  # one call: the engine thread sees all of them or none
        self._wake()

    def close(self) -> None:
        """No more rows will come."""
        self._done = True
        self._wake()

    def ready(self, step: int) -> bool:
        """Whether the row of decoding step `step` (0 = the first after the prefill) is known."""
        return self._done or step < len(self._rows)

    def at(self, step: int) -> Any:
        """The row fed at decoding step `step`: the reply's row, then the fill (also while waiting)."""
        return self._rows[step] if step < len(self._rows) else self._fill


def _stacked(rows: list[Any]) -> np.ndarray:
    """`[len(rows), hidden]` float32 numpy of `[hidden]` torch rows."""
    import torch

    return as_numpy(torch.stack(rows))
