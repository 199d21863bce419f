"""`TextDecoder`: streamed text equals a whole decode, incomplete characters are held back, and the
work per token is constant (no re-decode of the sequence so far)."""

from __future__ import annotations

import random

import pytest

from prismserve.executors.text import TextDecoder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class CountingTokenizer:
    """The real tokenizer, counting the ids that go through its Python `decode`."""

    def __init__(self, tokenizer) -> None:
        self.inner = tokenizer
        self.backend_tokenizer = tokenizer.backend_tokenizer
        self.decoded = 0

    def decode(self, ids, **options):
        self.decoded += len(ids)
        return self.inner.decode(ids, **options)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from prismserve.models import tiny

    return AutoTokenizer.from_pretrained(str(tiny.build("qwen2.5-vl")))


def streamed(decoder: TextDecoder, ids: list[int]) -> list[str]:
    return [decoder.push(token) for token in ids] + [decoder.flush()]


def test_stream_equals_a_whole_decode_and_holds_back_split_characters(tokenizer):
    text = "Cars 🚗🚕 on a 漢字 street — Ünïcødé!\n\n  spaced"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    deltas = streamed(TextDecoder(tokenizer, set()), ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)  # a multi-byte character never goes out half-made
    assert len([d for d in deltas if d]) > 5  # and text does stream


def test_random_ids_special_tokens_and_end_ids(tokenizer):
    rnd = random.Random(0)
    special = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for _ in range(30):
        ids = [rnd.randrange(len(tokenizer)) for _ in range(50)]
        decoder = TextDecoder(tokenizer, {special})
        expected = tokenizer.decode([i for i in ids if i != special], skip_special_tokens=True)
        assert "".join(streamed(decoder, ids)) == expected


def test_incomplete_character_at_the_end_is_flushed_as_a_replacement(tokenizer):
    ids = tokenizer("ok 🚗", add_special_tokens=False)["input_ids"]
    assert len(ids) > 2
    decoder = TextDecoder(tokenizer, set())
    head = "".join(decoder.push(t) for t in ids[:-1])
    assert "\ufffd" not in head
    assert decoder.flush() == tokenizer.decode(ids[:-1])[len(head) :] and "\ufffd" in tokenizer.decode(
        ids[:-1]
    )


def test_work_per_token_is_constant(tokenizer):
    """Re-decoding the whole sequence per token (the old decoder) decodes n(n+1)/2 ids; this decoder
    hands each id to the tokenizers library's DecodeStream once."""
    ids = tokenizer("streaming text, one token at a time. " * 60, add_special_tokens=False)["input_ids"]
    counting = CountingTokenizer(tokenizer)
    text = "".join(streamed(TextDecoder(counting, set()), ids))
    assert text == tokenizer.decode(ids)
    assert counting.decoded <= 4  # only what flush held back, never the sequence so far
