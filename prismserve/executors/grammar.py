"""JSON replies on the transformers engine: llguidance, the library vLLM's `guidance` backend runs,
masks each step's logits to the tokens that keep the reply valid under the request's JSON Schema.

Both engines use it the same way: JSON's optional whitespace left out (an untrained model would
emit whitespace until `max_tokens`), and once the JSON is complete only an end token is allowed.
"""

from __future__ import annotations

from typing import Any

from prismserve.task import InvalidInputError


class GrammarVocabulary:
    """llguidance's view of a tokenizer (built once per engine: it walks the whole vocabulary)."""

    def __init__(self, tokenizer: Any, vocab_size: int, end_ids: set[int]) -> None:
        import llguidance.hf

        self.info = llguidance.hf.from_tokenizer(
            tokenizer, max(vocab_size, len(tokenizer)), eos_token=sorted(end_ids)
        )

    def json(self, schema: dict[str, Any]) -> JsonGrammar:
        """A grammar for one reply that follows `schema` (an InvalidInputError if llguidance refuses it)."""
        return JsonGrammar(self.info, schema)


class JsonGrammar:
    """One reply held to a JSON Schema while it is generated."""

    def __init__(self, info: Any, schema: dict[str, Any]) -> None:
        import llguidance
        import llguidance.torch

        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        self.matcher = llguidance.LLMatcher(info, grammar)
        if error := self.matcher.get_error():
            raise InvalidInputError(f"json_schema cannot be followed: {error}")
        self.mask = llguidance.torch.allocate_token_bitmask(1, info.vocab_size)

    def allowed(self, scores: Any) -> Any:
        """`scores` ([1, vocab]) with every token the grammar forbids at -inf (in place)."""
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self.matcher, self.mask, 0)
        llguidance.torch.apply_token_bitmask_inplace(scores, self.mask.to(scores.device))
        return scores

    def take(self, token: int) -> None:
        """Advance past the chosen `token` (one `allowed` let through)."""
        if not self.matcher.is_stopped():
            self.matcher.consume_token(token)
