"""The scorer thread's work on the model: batches of single items, shared-context groups, group requests.

Every item gets exactly one result: a failed shared forward or batch falls back item by item
(``RewardModel.score_prepared_each``), and errors are counted and delivered to the item's future.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor, wait
from typing import Any

from ...engine.workers import unexpected
from ...forward.batching import plan_batches
from .contexts import PrefixCache
from ..metrics import Metrics

log = logging.getLogger("nvrm.serve.batching.scheduler")

FORWARD_LOCK = threading.Lock()
"""One forward pass at a time in the process, whichever model runs it: the models a service holds (several by
name, or an old revision draining beside a new one during a swap) share one device and one CPU thread pool, and
two forwards at once would split their reductions differently, so a reward would depend on what else ran."""


def resolve(fut: Future, value: Any) -> None:
    """Deliver ``value`` unless the future is already done (cancelled, or answered by the drain)."""
    if not fut.done():
        try:
            fut.set_result(value)
        except InvalidStateError:  # cancelled (or resolved) between the check and the set
            pass


class Execution:
    """Runs what the scheduler's batching loop hands it, on the model, with metrics.

    A model that takes several forwards at once (``concurrent_forwards`` > 1: a vLLM server, which batches them itself
    and shares no device with this process) runs them on forward threads of their own, without ``FORWARD_LOCK``: a
    call that hangs (up to the backend's timeout) holds its own items only, and the scorer goes on batching."""

    def __init__(self, model, metrics: Metrics, prefixes: PrefixCache):
        self.model = model
        self.engine = model.engine
        self.metrics = metrics
        self.prefixes = prefixes
        n = getattr(model, "concurrent_forwards", 1)
        n = n if type(n) is int and n > 1 else 1
        self.lock: Any = FORWARD_LOCK if n == 1 else contextlib.nullcontext()
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="nvrm-forward") if n > 1 else None
        self._free = threading.Semaphore(n)
        self._running: set[Future] = set()
        self._guard = threading.Lock()

    def run(self, works: list[Any], group: bool) -> None:
        """Score ``works`` (one group, or single items batched), then let them go (each one's ``settled``): here, or on a
        forward thread once one is free (the wait is bounded by the backend's own timeout)."""
        if self._pool is None:
            return self._run_now(works, group)
        self._free.acquire()
        try:
            fut = self._pool.submit(self._run_now, works, group)
        except BaseException:
            self._free.release()
            raise
        with self._guard:
            self._running.add(fut)
        fut.add_done_callback(self._ended)

    def _ended(self, fut: Future) -> None:
        with self._guard:
            self._running.discard(fut)
        self._free.release()
        if not fut.cancelled() and (e := fut.exception()) is not None:
            log.error("a forward thread failed: %s", " ".join(str(e).split())[:300] or type(e).__name__)

    def _run_now(self, works: list[Any], group: bool) -> None:
        try:
            if group:
                self.run_group(works[0])
            else:
                self.run_singles(works)
        finally:
            for w in works:
                resolve(w.settled, None)

    def wait(self, timeout: float | None) -> bool:
        """Whether every forward handed to a forward thread has ended within ``timeout`` (then the threads are let go)."""
        if self._pool is None:
            return True
        with self._guard:
            running = list(self._running)
        _, left = wait(running, timeout)
        if not left:
            self._pool.shutdown(wait=False)
        return not left

    def run_singles(self, batch: list[Any]) -> None:
        by_key: dict[Any, list[Any]] = defaultdict(list)
        loose: list[Any] = []
        for s in batch:
            (by_key[s.key] if s.key is not None else loose).append(s)
        alone = len(batch) == 1
        for key, members in by_key.items():
            # through the context's prefix (kept for later batches): items sharing it here, items of a
            # context prefilled before, and a batch's only item (nothing to pad it with anyway)
            if (len(members) > 1 or alone or self.prefixes.holds(key)) and self._run_shared(key, members):
                continue
            loose += members
        exact = [s for s in loose if s.exact]
        padded = [s for s in loose if not s.exact]
        for s in exact:
            self._forward([s], exact=True)
        lengths = [s.item.encoded.num_tokens for s in padded]
        for rows in plan_batches(lengths, self.model.max_batch_tokens):
            self._forward([padded[i] for i in rows], exact=False)

    def _forward(self, batch: list[Any], exact: bool) -> None:
        t = time.perf_counter()  # every item is within the sequence limit: the engine refused longer ones at encoding
        with self.lock:
            results = self.model.score_prepared_each([s.item for s in batch], exact=exact)
        self.metrics.forward.labels(kind="batch").observe(time.perf_counter() - t)
        self.metrics.batch_size.observe(len(batch))
        self.metrics.batch_tokens.observe(len(batch) * max(s.item.encoded.num_tokens for s in batch))
        for s, r in zip(batch, results):
            self.metrics.items.labels(outcome="error" if isinstance(r, Exception) else "ok").inc()
            resolve(s.future, r)

    def _run_shared(self, key: tuple[str, str], members: list[Any]) -> bool:
        """Items of one prompt and context (from any requests) as one group, reusing and keeping its prefix."""
        group = self.engine.group_of(key[0], [m.item for m in members])
        if group is None:
            return False
        prefix = self.prefixes.get(key)
        t = time.perf_counter()
        try:
            with self.lock:
                results, used = self.model.score_prepared_group_reusing(group, prefix)
            self.prefixes.put(key, used)
        except Exception as e:  # noqa: BLE001
            log.warning("a shared-context group failed unexpectedly", exc_info=True)
            self.prefixes.clear()  # it may have run out of device memory: give the kept prefixes back
            results = [unexpected(e)] * len(members)
        self.metrics.forward.labels(kind="shared").observe(time.perf_counter() - t)
        self.metrics.batch_size.observe(len(members))
        if len(members) > 1 or prefix is not None:
            self.metrics.shared.inc(len(members))
        for m, r in zip(members, results):
            self.metrics.items.labels(outcome="error" if isinstance(r, Exception) else "ok").inc()
            resolve(m.future, r)
        return True

    def run_group(self, g: Any) -> None:
        t = time.perf_counter()
        try:
            with self.lock:
                out = self.model.score_prepared_group(g.prepared, exact=g.exact)
        except Exception as e:  # noqa: BLE001
            log.warning("a group failed unexpectedly", exc_info=True)
            out = [unexpected(e)] * g.size
        self.metrics.forward.labels(kind="group").observe(time.perf_counter() - t)
        self.metrics.batch_size.observe(max(1, len(g.prepared.good)))
        for r in out:
            self.metrics.items.labels(outcome="error" if isinstance(r, Exception) else "ok").inc()
        resolve(g.future, out)

