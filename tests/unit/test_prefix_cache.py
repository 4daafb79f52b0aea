"""The service's kept prefixes: least recently used out first, within a byte budget."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from nvrm.serve.batching.contexts import PrefixCache, prefix_bytes


def fake_prefix(tokens: int, lengths=(100,)):
    """Per total length kept, two layers of bf16 keys and values, 1 head of 8 dims: 2 * 2 * tokens * 8 * 2 bytes."""
    kv = {n: [(torch.zeros(1, 1, tokens, 8, dtype=torch.bfloat16), torch.zeros(1, 1, tokens, 8, dtype=torch.bfloat16)) for _ in range(2)] for n in lengths}
    return SimpleNamespace(kv=kv)


def test_bytes_count_every_kept_length():
    assert prefix_bytes(fake_prefix(10, lengths=(100, 120))) == 2 * prefix_bytes(fake_prefix(10))


def test_bytes_and_lru_order_within_the_budget():
    p = fake_prefix(10)
    assert prefix_bytes(p) == 2 * 2 * 10 * 8 * 2
    lookups = []
    cache = PrefixCache(3 * prefix_bytes(p), lookups.append)
    for name in "abc":
        cache.put(("prompt", name), fake_prefix(10))
    assert cache.get(("prompt", "a")) is not None  # a is now the most recent
    cache.put(("prompt", "d"), fake_prefix(10))  # over budget: b (least recent) goes
    assert not cache.holds(("prompt", "b")) and all(cache.holds(("prompt", k)) for k in "acd")
    assert cache.bytes == 3 * prefix_bytes(p)
    assert cache.get(("prompt", "b")) is None and lookups == [True, False]


def test_replacing_an_entry_does_not_count_it_twice():
    cache = PrefixCache(10_000)
    cache.put(("p", "x"), fake_prefix(10))
    cache.put(("p", "x"), fake_prefix(20))
    assert cache.bytes == prefix_bytes(fake_prefix(20))


def test_an_entry_over_the_whole_budget_and_a_zero_budget_keep_nothing():
    big = fake_prefix(100)
    cache = PrefixCache(prefix_bytes(big) - 1)
    cache.put(("p", "x"), big)
    assert cache.bytes == 0 and not cache.holds(("p", "x"))
    off = PrefixCache(0)
    off.put(("p", "x"), fake_prefix(1))
    assert off.get(("p", "x")) is None and off.bytes == 0


def test_clear_gives_everything_back():
    cache = PrefixCache(10_000)
    cache.put(("p", "x"), fake_prefix(10))
    cache.clear()
    assert cache.bytes == 0 and not cache.holds(("p", "x"))


def _video(nbytes: int):
    return SimpleNamespace(images=(), pixels=torch.zeros(nbytes, dtype=torch.uint8))


def test_the_context_cache_never_holds_more_than_its_budget():
    from concurrent.futures import Future

    from nvrm.serve.batching.contexts import ContextCache

    def done(value):
        f: Future = Future()
        f.set_result(value)
        return f

    hits = []
    cache = ContextCache(1000, lambda hit: hits.append(hit))
    big = cache.get_or_prepare("big", lambda: done(_video(5000)))
    assert big.result().pixels.numel() == 5000 and cache.bytes == 0  # its request gets it; the cache does not keep it
    pending: Future = Future()
    cache.get_or_prepare("pending", lambda: pending)
    for k in range(6):
        cache.get_or_prepare(f"k{k}", lambda: done(_video(300)))
        assert cache.bytes <= 1000
    assert cache.bytes == 900
    hits.clear()
    cache.get_or_prepare("pending", lambda: done(_video(1)))  # still in flight: shared, not evicted
    cache.get_or_prepare("k0", lambda: done(_video(300)))  # long evicted: prepared again
    assert hits == [True, False]


def test_the_one_byte_lru_behind_the_caches():
    from nvrm.serve.batching.lru import ByteLRU

    looks = []
    lru = ByteLRU(100, looks.append)
    assert lru.put("a", 1, 40) and lru.put("b", 2, 40)
    assert lru.get("a") == 1  # a is now the most recent
    assert lru.put("c", 3, 40) and not lru.holds("b") and lru.evictions == 1 and lru.bytes == 80
    assert not lru.put("huge", 4, 101) and not lru.holds("huge") and lru.bytes == 80
    lru.reserve("flight", 5)  # size unknown yet: never evicted to make room
    assert lru.put("d", 6, 60) and lru.holds("flight") and lru.bytes <= 100
    assert lru.settle("flight", 5, 30) and lru.bytes <= 100
    assert not lru.settle("flight", 999, 1)  # another value under that key: not settled
    assert lru.get("zzz") is None and looks == [True, False]
    assert lru.peek("d") == 6 and looks == [True, False]  # peeks are not counted
    off = ByteLRU(0, looks.append)
    assert not off.put("x", 1, 1) and off.get("x") is None
