"""Contexts shared across requests, each kind in a byte-bounded LRU (``lru.ByteLRU``), keyed by content.

Trainers often send a group's candidates as separate requests; each carries
the same context. The first request prepares it (in the engine's workers);
later ones, and concurrent ones still waiting on that first preparation,
get the same prepared context. Entries are dropped least-recently-used
first once their bytes (frames and patches) pass the budget.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable

from .lru import ByteLRU


def video_bytes(video) -> int:
    """Memory a prepared video holds: its contract frames and its patches."""
    n = sum(im.width * im.height * len(im.getbands()) for im in video.images)
    if video.pixels is not None:
        n += video.pixels.numel() * video.pixels.element_size()
    return n


class ContextCache:
    """key -> Future[PreparedVideo], at most ``max_bytes`` of finished entries (0 disables it); an entry
    larger than the whole budget is never kept, and one still being prepared is never dropped."""

    def __init__(self, max_bytes: int, on_lookup: Callable[[bool], None] | None = None):
        self._lru: ByteLRU[str, Future] = ByteLRU(max_bytes, on_lookup)
        self._lock = threading.Lock()

    max_bytes = property(lambda self: self._lru.max_bytes)
    enabled = property(lambda self: self._lru.enabled)
    bytes = property(lambda self: self._lru.bytes)

    def get_or_prepare(self, key: str, prepare: Callable[[], Future]) -> Future:
        """The cached (or in-flight) preparation of ``key``, else ``prepare()``'s, remembered."""
        if not self.enabled:
            self._lru.get(key)  # counted as a miss
            return prepare()
        with self._lock:
            hit = self._lru.get(key)
            if hit is not None:
                return hit
            future = prepare()
            self._lru.reserve(key, future)
        future.add_done_callback(lambda f: self._settle(key, f))
        return future

    def _settle(self, key: str, future: Future) -> None:
        if future.cancelled() or future.exception() is not None:
            with self._lock:  # a failure is not remembered: the next request tries again
                if self._lru.peek(key) is future:
                    self._lru.pop(key)
            return
        self._lru.settle(key, future, video_bytes(future.result()))


def prefix_bytes(prefix) -> int:
    """Device memory a prefilled prefix holds: its per-layer keys and values."""
    return sum(t.numel() * t.element_size() for layers in prefix.kv.values() for kv in layers for t in kv)


class PrefixCache:
    """(prompt, context key) -> a prefilled ``Prefix`` (the context's KV on the device), LRU within ``max_bytes``.

    Items of one context often reach the scorer in different batches (a trainer sends a
    group's candidates as separate requests, and they arrive over a few hundred
    milliseconds). The first batch prefills the context; later ones run only their
    candidates' suffixes against the kept KV. 0 turns it off; an entry larger than the whole
    budget is not kept.
    """

    def __init__(self, max_bytes: int, on_lookup: Callable[[bool], None] | None = None):
        self._lru: ByteLRU[tuple[str, str], Any] = ByteLRU(max_bytes, on_lookup)

    max_bytes = property(lambda self: self._lru.max_bytes)
    bytes = property(lambda self: self._lru.bytes)

    def holds(self, key: tuple[str, str]) -> bool:
        """Whether a prefix is kept for ``key`` (no lookup is counted)."""
        return self._lru.holds(key)

    def get(self, key: tuple[str, str]):
        """The kept prefix of ``key``, or None."""
        return self._lru.get(key) if self._lru.enabled else None

    def clear(self) -> None:
        """Drop every kept prefix (after a failed forward, which may have been out of memory)."""
        self._lru.clear()

    def put(self, key: tuple[str, str], prefix) -> None:
        """Keep ``prefix`` for ``key``, dropping the least recently used entries beyond the budget."""
        if prefix is not None:
            self._lru.put(key, prefix, prefix_bytes(prefix))


class UploadedContexts(ByteLRU[str, Any]):
    """Uploaded contexts (``POST /v1/contexts``) by content hash: raw sampled frames or encoded bytes,
    LRU within ``max_bytes``. Requests name them with ``{"ref": hash}`` instead of carrying them.

    A hash is of content plus the contract fingerprint (``protocol.context_ref``), so a client can
    only ask about content it already holds: presence tells it nothing it could not hash itself.
    """
