"""The registry of served models: name -> the entry serving it, one atomic pointer per name, swappable under load.

    registry: name ─► ModelEntry (model, its digest, its scheduler, its caches, in-flight count)

A request names a ``model`` (default: the first); it is parsed by that model's contract, and admitted to the entry
the pointer holds when it is scored: it counts as in flight there until it is answered (``acquire`` / ``release``,
the lease ``Serving.score`` takes for every path), so a swap (``model_swap.swap``) never moves it. A retired entry is
freed once its last request is answered.

Caches: the context store (content) is the service's; the prepared-context cache and the prefix cache (KV of one
digest's weights) belong to an entry, so nothing one revision prepared or scored is served as another's.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ..admission.requests import ParseTarget, being_replaced, not_served
from ..batching.contexts import ContextCache, PrefixCache
from ..batching.scheduler import Scheduler
from ...errors import ConfigError
from ...guard.monitor import Monitor
from ..config import ServeConfig
from .weights import model_bytes, release_freed_memory, weights_digest

log = logging.getLogger(__name__)


class ModelEntry:
    """One revision of one named model (its weights, by ``digest``), with its own scheduler and caches."""

    def __init__(self, name: str, model, config: ServeConfig, metrics, caches: tuple[ContextCache, PrefixCache]):
        if config.conservative is not None and getattr(model, "guard", None) is None:
            raise ConfigError(f"--conservative {config.conservative:g}: model {name!r} ({getattr(model, 'path', None)}) has no guard, so "
                              "the protocols cannot hand out its conservative reward; fit one with nvrm guard fit")
        self.name, self.model, self.digest = name, model, weights_digest(model)
        self.cache, self.prefixes = caches
        c = config
        self.scheduler = Scheduler(model, max_batch_items=c.max_batch_items, max_wait_ms=c.max_wait_ms, share_wait_ms=c.share_wait_ms,
                                   max_queue_items=c.max_queue_items, metrics=metrics, cache=self.cache, prefixes=self.prefixes)
        self.inflight = 0
        self.retired = False
        self.memory = model_bytes(model)
        self.fingerprint, self.path = model.fingerprint, getattr(model, "path", None)  # still listed once the model is freed
        self.monitor = model.watch(config.monitor_settings()) if hasattr(model, "watch") else Monitor(None, None, config.monitor_settings())
        """Rolling statistics of what this revision scores, against its guard (``GET /v1/models/NAME/monitor``)."""

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/models`` lists of it."""
        return {
            "name": self.name, "revision": self.digest, "contract": self.fingerprint,
            "state": ("draining" if self.inflight else "freeing") if self.retired else "serving",
            "memory_bytes": self.memory, "in_flight": self.inflight,
            "path": str(self.path) if self.path else None,
        }

    def free(self, drain_s: float) -> None:
        """Stop its scheduler and let go of its model and caches (a retired entry, nothing in flight)."""
        try:
            self.scheduler.begin_drain(drain_s)
            self.scheduler.stop(drain_s)
            self.prefixes.clear()
            self.model.close()
        except Exception:  # noqa: BLE001 — freeing an old revision never takes down the service
            log.exception("freeing model %s revision %s failed", self.name, self.digest)
        self.model = self.scheduler = None  # type: ignore[assignment] - nothing left holds the weights
        release_freed_memory()
        log.info("model %s: revision %s freed", self.name, self.digest)


class Registry:
    """name -> the entry serving it (one pointer each, switched atomically), the entries still draining,
    and the one swap that may run at a time."""

    def __init__(self, drain_s: float):
        self._lock = threading.Lock()
        self.entries: dict[str, ModelEntry] = {}
        self.retiring: list[ModelEntry] = []
        self.swapping = threading.Lock()
        self.drain_s = drain_s
        self.replacing: set[str] = set()
        """Names whose old revision is drained before the new one loads (``--swap-mode replace``): 503 meanwhile."""
        self.switched: list[Callable[[str, str, str], None]] = []
        """Called with (name, old digest, new digest) each time ``add`` serves other weights under a name (every
        swap: ``PUT /v1/models``, ``--watch``, a Ray roll); the Redis job store records it for the queued jobs."""

    @property
    def names(self) -> list[str]:
        """The served names, the default first."""
        return list(self.entries)

    def digests(self, *, serving: bool = False) -> dict[str, str]:
        """{name: the digest of the weights serving it} (``serving``: without the names ``--swap-mode replace`` is loading)."""
        with self._lock:
            return {n: e.digest for n, e in self.entries.items() if not (serving and n in self.replacing)}

    def parse_targets(self) -> tuple[dict[str, ParseTarget], tuple[str, ...], frozenset[str]]:
        """What decoding reads of the served models, at this instant: {name: its model and prepared-context cache} of those
        taking requests, every name (the default first), and the names ``--swap-mode replace`` is loading."""
        with self._lock:
            targets = {n: ParseTarget(e.model, e.cache) for n, e in self.entries.items() if n not in self.replacing}
            return targets, tuple(self.entries), frozenset(self.replacing)

    def current(self, name: str | None) -> ModelEntry:
        """The entry serving ``name`` (None: the first); ``RequestError`` (400) naming the served models if unknown."""
        with self._lock:
            return self._lookup(name)

    def _lookup(self, name: str | None) -> ModelEntry:
        if name is None and self.entries:
            name = next(iter(self.entries))
        if name not in self.entries:
            raise not_served(name, list(self.entries))
        if name in self.replacing:
            raise being_replaced(name)  # type: ignore[arg-type]
        return self.entries[name]  # type: ignore[index]

    def hold(self, name: str) -> ModelEntry:
        """Stop admitting requests to ``name`` (503 until ``add`` serves its new entry) and retire the entry serving it;
        it is freed once drained (``drained`` waits for that)."""
        with self._lock:
            old = self.entries[name]
            self.replacing.add(name)
            idle = self._retire(old)
        if idle:
            self._free(old)
        return old

    def drained(self, e: ModelEntry, seconds: float) -> bool:
        """Wait up to ``seconds`` (and the freeing itself) for a retired entry to be answered out and freed."""
        deadline = time.monotonic() + seconds + 30
        while time.monotonic() < deadline:
            with self._lock:
                if e not in self.retiring:
                    return True
            time.sleep(0.02)
        return False

    def acquire(self, name: str | None) -> ModelEntry:
        """The entry serving ``name``, counted in flight until ``release`` (its lease: ``Serving.score`` takes every one)."""
        with self._lock:
            e = self._lookup(name)
            e.inflight += 1
            return e

    def release(self, e: ModelEntry) -> None:
        """One request of ``e`` answered; a retired entry whose last one it was is freed (in a thread)."""
        with self._lock:
            e.inflight -= 1
            done = e.retired and e.inflight == 0
        if done:
            self._free(e)

    def add(self, e: ModelEntry) -> ModelEntry | None:
        """Serve ``e`` under its name from now on (atomically); the entry it replaces is retired and returned."""
        with self._lock:
            old = self.entries.get(e.name)
            self.entries[e.name] = e
            self.replacing.discard(e.name)
            held = old is None or old.retired  # none, or held and drained already (--swap-mode replace)
            idle = False if held else self._retire(old)  # type: ignore[arg-type]
        if old is not None and old.digest != e.digest:
            for note in list(self.switched):
                try:
                    note(e.name, old.digest, e.digest)
                except Exception:  # noqa: BLE001 - a listener never fails a swap
                    log.exception("model %s: a listener of the swap %s -> %s failed", e.name, old.digest, e.digest)
        if held:
            return None
        if idle:
            self._free(old)  # type: ignore[arg-type]
        return old

    def _retire(self, old: ModelEntry) -> bool:
        """Mark ``old`` retired (the lock held); True when nothing is in flight on it, so the caller frees it now."""
        old.retired = True
        self.retiring.append(old)
        return old.inflight == 0

    def _free(self, e: ModelEntry) -> None:
        def run() -> None:
            e.free(self.drain_s)
            with self._lock:
                if e in self.retiring:
                    self.retiring.remove(e)

        threading.Thread(target=run, name=f"nvrm-free-{e.name}", daemon=True).start()

    def all(self) -> list[ModelEntry]:
        """Every entry: serving ones, then those still draining."""
        with self._lock:
            serving = list(self.entries.values())
            return serving + [e for e in self.retiring if not any(e is s for s in serving)]
