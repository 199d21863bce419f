"""Token ids to text at constant cost per token, the same for every engine (transformers, vLLM): a
user gets the same text for the same tokens whichever engine generated them."""

from __future__ import annotations

from typing import Any


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
