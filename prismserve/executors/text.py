"""Token ids to text at constant cost per token, the same for every engine (transformers, vLLM): a
user gets the same text for the same tokens whichever engine generated them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prismserve.protocol.chat import FinishReason, TextDelta, TokenLogprob


class TextDecoder:
    """Token ids in, text deltas out, at constant cost per token (the tokenizers library's
    `DecodeStream`); holds back incomplete UTF-8 sequences and end tokens."""

    def __init__(self, tokenizer: Any, end_ids: set[int]) -> None:
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.end_ids = end_ids
        self.stream = DecodeStream(skip_special_tokens=True)
        self.held: list[int] = []  # ids whose text the stream has not given out yet

    def push(self, token: int) -> str:
        """The new text after `token` ('' while a character is incomplete)."""
        if token in self.end_ids:
            return ""
        text = self.stream.step(self.tokenizer.backend_tokenizer, token)
        if not text:
            self.held.append(token)
            return ""
        self.held.clear()
        return text

    def flush(self) -> str:
        """Text held back at the end (an incomplete character decodes as U+FFFD)."""
        held, self.held = self.held, []
        return self.tokenizer.decode(held, skip_special_tokens=True) if held else ""


class ReplyText:
    """A reply's token ids (and their log-probabilities) in, `TextDelta`s out: the text at constant
    cost per token (`TextDecoder`), cut at the first of the request's `stop` strings, every token
    counted. While stop strings are asked for, the last characters (one fewer than the longest stop
    string has) are held back until more text comes, as vLLM does: no part of a stop string reaches
    the client, even when it spans tokens."""

    def __init__(self, tokenizer: Any, end_ids: set[int], stop: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.decoder = TextDecoder(tokenizer, end_ids)
        self.stop = [s for s in stop or [] if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.pending = ""  # decoded text not given out yet
        self.tokens = 0  # tokens not yet reported in a delta
        self.taken = 0  # tokens pushed in all: the reply's, up to the one that ended it at a stop string
        self.logprobs: list[TokenLogprob] = []
        self.stopped = False  # a stop string was found: the reply ends there
        self.finished = False  # the last delta was given out

    def push(self, token: int, logprobs: Any = None) -> TextDelta | None:
        """The delta to stream after `token` (`logprobs`: `(logprob, [(id, logprob), ...])` from the
        engine, or None), or None while there is no text to give out; nothing once `stopped`."""
        if self.stopped:
            return None
        self.tokens += 1
        self.taken += 1
        if logprobs is not None:
            self.logprobs.append(self.token_logprob(token, *logprobs))
        self.pending += self.decoder.push(token)
        return self._release(final=False)

    def finish(self, reason: FinishReason, prompt_tokens: int | None) -> TextDelta:
        """The last delta: text held back, the finish reason ("stop" if a stop string ended it)
        and the prompt's length."""
        if not self.stopped:
            self.pending += self.decoder.flush()
        self.finished = True
        last = self._release(final=True) or TextDelta()
        return replace(last, finish_reason="stop" if self.stopped else reason, prompt_tokens=prompt_tokens)

    def _release(self, final: bool) -> TextDelta | None:
        if self.stop and not self.stopped:
            found = [i for i in (self.pending.find(s) for s in self.stop) if i >= 0]
            if found:
                self.pending, self.stopped = self.pending[: min(found)], True
        keep = 0 if final or self.stopped else min(self.hold, len(self.pending))
        text, self.pending = (
            self.pending[: len(self.pending) - keep],
            self.pending[len(self.pending) - keep :],
        )
        if not text and not final:
            return None
        delta = TextDelta(text, self.tokens, tuple(self.logprobs) if self.logprobs else None)
        self.tokens, self.logprobs = 0, []
        return delta

    def token_logprob(self, token: int, logprob: float, top: list[tuple[int, float]]) -> TokenLogprob:
        """A token's log-probability as the API reports it: its text and UTF-8 bytes, and the
        alternatives'."""
        alternatives = tuple(self._logprob(i, p) for i, p in top)
        return replace(self._logprob(token, logprob), top=alternatives)

    def _logprob(self, token: int, logprob: float) -> TokenLogprob:
        text = self.tokenizer.decode([token])
        return TokenLogprob(text, float(logprob), list(text.encode()))
