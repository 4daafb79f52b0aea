"""Prepared contexts shared across requests: an LRU bounded in bytes, keyed by content.

Trainers often send a group's candidates as separate requests; each carries
the same context. The first request prepares it (in the engine's workers);
later ones, and concurrent ones still waiting on that first preparation,
get the same prepared context. Entries are dropped least-recently-used
first once their bytes (frames and patches) pass the budget.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable


def video_bytes(video) -> int:
    """Memory a prepared video holds: its contract frames and its patches."""
    n = sum(im.width * im.height * len(im.getbands()) for im in video.images)
    if video.pixels is not None:
        n += video.pixels.numel() * video.pixels.element_size()
    return n


class ContextCache:
    """key -> Future[PreparedVideo], at most ``max_bytes`` of finished entries (0 disables it); an entry
    larger than the whole budget is never kept."""

    def __init__(self, max_bytes: int, on_lookup: Callable[[bool], None] | None = None):
        self.max_bytes = max_bytes
        self._entries: "OrderedDict[str, tuple[Future, int]]" = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._on_lookup = on_lookup or (lambda hit: None)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def get_or_prepare(self, key: str, prepare: Callable[[], Future]) -> Future:
        """The cached (or in-flight) preparation of ``key``, else ``prepare()``'s, remembered."""
        if not self.enabled:
            self._on_lookup(False)
            return prepare()
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self._on_lookup(True)
                return hit[0]
            future = prepare()
            self._entries[key] = (future, 0)
        self._on_lookup(False)
        future.add_done_callback(lambda f: self._settle(key, f))
        return future

    def _settle(self, key: str, future: Future) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] is not future:
                return
            if future.cancelled() or future.exception() is not None:
                del self._entries[key]  # a failure is not remembered: the next request tries again
                return
            size = video_bytes(future.result())
            if size > self.max_bytes:  # larger than the whole budget: its requests get it, the cache does not
                del self._entries[key]
                return
            self._entries[key] = (future, size)
            self._bytes += size
            # least recently used finished entries go first; in-flight ones hold no bytes yet and stay
            for old in [k for k, (f, n) in self._entries.items() if n > 0 and k != key]:
                if self._bytes <= self.max_bytes:
                    break
                self._bytes -= self._entries.pop(old)[1]


def prefix_bytes(prefix) -> int:
    """Device memory a prefilled prefix holds: its per-layer keys and values."""
    return sum(t.numel() * t.element_size() for layers in prefix.kv.values() for kv in layers for t in kv)


class PrefixCache:
    """(prompt, context key) -> a prefilled ``Prefix`` (the context's KV on the device), LRU within ``max_bytes``.

    Items of one context often reach the scorer in different batches (a trainer sends a
    group's candidates as separate requests, and they arrive over a few hundred
    milliseconds). The first batch prefills the context; later ones run only their
    candidates' suffixes against the kept KV. Only the scorer thread uses it; 0 turns
    it off. An entry larger than the whole budget is not kept.
    """

    def __init__(self, max_bytes: int, on_lookup: Callable[[bool], None] | None = None):
        self.max_bytes = max_bytes
        self._entries: "OrderedDict[tuple[str, str], tuple[object, int]]" = OrderedDict()
        self._bytes = 0
        self._on_lookup = on_lookup or (lambda hit: None)

    @property
    def bytes(self) -> int:
        return self._bytes

    def holds(self, key: tuple[str, str]) -> bool:
        """Whether a prefix is kept for ``key`` (no lookup is counted)."""
        return key in self._entries

    def get(self, key: tuple[str, str]):
        """The kept prefix of ``key``, or None."""
        if self.max_bytes <= 0:
            return None
        entry = self._entries.get(key)
        self._on_lookup(entry is not None)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def clear(self) -> None:
        """Drop every kept prefix (after a failed forward, which may have been out of memory)."""
        self._entries.clear()
        self._bytes = 0

    def put(self, key: tuple[str, str], prefix) -> None:
        """Keep ``prefix`` for ``key``, dropping the least recently used entries beyond the budget."""
        if self.max_bytes <= 0 or prefix is None:
            return
        size = prefix_bytes(prefix)
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if size > self.max_bytes:
            return
        self._entries[key] = (prefix, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped


class ContextStore:
    """Uploaded contexts (``POST /v1/contexts``) by content hash: raw sampled frames or encoded bytes,
    LRU within ``max_bytes``. Requests name them with ``{"ref": hash}`` instead of carrying them.

    A hash is of content plus the contract fingerprint (``protocol.context_ref``), so a client can
    only ask about content it already holds: presence tells it nothing it could not hash itself.
    """

    def __init__(self, max_bytes: int, on_lookup: Callable[[bool], None] | None = None):
        self.max_bytes = max_bytes
        self._entries: "OrderedDict[str, tuple[object, int]]" = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self.evictions = 0
        self._on_lookup = on_lookup or (lambda hit: None)

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, ref: str) -> bool:
        """Whether ``ref`` is stored (not counted as a lookup)."""
        return ref in self._entries

    def peek(self, ref: str):
        """The stored media for ``ref`` or None, not counted as a lookup (a context that came inline again)."""
        with self._lock:
            entry = self._entries.get(ref)
            if entry is not None:
                self._entries.move_to_end(ref)
        return entry[0] if entry is not None else None

    def get(self, ref: str):
        """The stored media for ``ref`` (now most recently used), or None; counted as a hit or a miss."""
        with self._lock:
            entry = self._entries.get(ref)
            if entry is not None:
                self._entries.move_to_end(ref)
        self._on_lookup(entry is not None)
        return entry[0] if entry is not None else None

    def put(self, ref: str, media, size: int) -> bool:
        """Keep ``media`` under ``ref``; False if it alone is over the budget (then nothing is kept)."""
        with self._lock:
            old = self._entries.pop(ref, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return False
            self._entries[ref] = (media, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
                self.evictions += 1
            return True
