"""The encoder's output cache: keyed by content, bounded in bytes, least recently used out first."""

from __future__ import annotations

import asyncio

import numpy as np

from prismserve.executors.encoder import EncodedCache
from prismserve.models import Encoded


def encoder(calls: list[bytes]):
    """An encode step for one item: its bytes as 1 KiB of embeddings, counted in `calls`."""

    def for_item(data: bytes):
        async def encode():
            calls.append(data)
            return Encoded("image", np.full(256, len(calls), dtype=np.float32))

        return encode

    return for_item


def test_the_cache_keeps_to_its_bound_dropping_the_least_recently_used():
    calls: list[bytes] = []
    encode = encoder(calls)
    cache = EncodedCache(limit=2 * 1024)  # two outputs

    async def go():
        for data in (b"a", b"b", b"a", b"c", b"a", b"b"):  # c pushes out b, not a (used since)
            await cache.get(data, encode(data))

    asyncio.run(go())
    assert calls == [b"a", b"b", b"c", b"b"]
    assert cache.size <= cache.limit and len(cache) == 2
    assert (cache.hits, cache.misses) == (2, 4)


def test_an_output_larger_than_the_cache_is_served_and_not_kept():
    calls: list[bytes] = []
    cache = EncodedCache(limit=512)
    result = asyncio.run(cache.get(b"big", encoder(calls)(b"big")))
    assert result.embeddings.nbytes == 1024 and len(cache) == 0 and cache.size == 0
