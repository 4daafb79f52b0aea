"""One least-recently-used map bounded in bytes: what the service's caches and stores are built on.

``put`` keeps a value with its size and drops the least recently used entries until the total is
within ``max_bytes``; a value larger than the whole budget is not kept. Entries of size 0 (work
still in flight, whose size is not known yet) are never dropped to make room. ``get`` counts a
hit or a miss (``on_lookup``); ``peek`` and ``holds`` do not. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    """key -> value with a byte size, at most ``max_bytes`` in all (0 keeps nothing)."""

    def __init__(self, max_bytes: int, on_lookup: Callable[[bool], None] | None = None):
        self.max_bytes = max_bytes
        self._entries: "OrderedDict[K, tuple[V, int]]" = OrderedDict()
        self._bytes = 0
        self._lock = threading.RLock()
        self.evictions = 0
        self._on_lookup = on_lookup or (lambda hit: None)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, key: K) -> bool:
        """Whether ``key`` is kept (not counted as a lookup)."""
        return key in self._entries

    def peek(self, key: K) -> V | None:
        """The value of ``key`` (now most recently used) or None, not counted as a lookup."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def get(self, key: K) -> V | None:
        """``peek``, counted as a hit or a miss."""
        value = self.peek(key) if self.enabled else None
        self._on_lookup(value is not None)
        return value

    def put(self, key: K, value: V, size: int) -> bool:
        """Keep ``value`` under ``key`` (replacing what was there); False, and nothing kept, when it alone is
        over the budget or the map is off."""
        with self._lock:
            self._drop(key)
            if not self.enabled or size > self.max_bytes:
                return False
            self._entries[key] = (value, size)
            self._bytes += size
            self._shrink(keep=key)
            return True

    def reserve(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key`` with no size yet (in flight: never dropped to make room)."""
        with self._lock:
            self._drop(key)
            self._entries[key] = (value, 0)

    def settle(self, key: K, value: V, size: int) -> bool:
        """The size of a reserved entry, now known (if ``key`` still holds ``value``); dropped when over the
        whole budget. Returns whether it is kept."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] is not value:
                return False
            return self.put(key, value, size)

    def pop(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            self._drop(key)
            return entry[0] if entry is not None else None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def items(self) -> list[tuple[K, V]]:
        with self._lock:
            return [(k, v) for k, (v, _) in self._entries.items()]

    def _drop(self, key: K) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]

    def _shrink(self, keep: Any) -> None:
        for old in [k for k, (_, n) in self._entries.items() if n > 0 and k != keep]:
            if self._bytes <= self.max_bytes:
                break
            self._bytes -= self._entries.pop(old)[1]
            self.evictions += 1
