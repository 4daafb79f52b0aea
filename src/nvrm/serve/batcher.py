"""Dynamic batching across requests.

Request handlers (on the event loop) only admit work and await futures.
Preprocessing runs in the model's worker pool; the prepared items land on a
queue that one scorer thread drains: it takes the first ready item, waits up
to ``max_wait_ms`` for more (from any request), and runs them as token-budgeted
forward passes. A group (shared context) is scored as its own unit with
prefix reuse. Every admitted item gets exactly one result (a ScoreResult or an
error), so nothing is lost or duplicated, and admission is bounded: when
``max_queue_items`` are in flight, new work is refused (HTTP 503).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..engine.workers import unexpected
from ..errors import NvrmError
from .metrics import Metrics

log = logging.getLogger(__name__)




@dataclass
class _Single:
    prepared: Any
    future: Future
    tokens: int


@dataclass
class _Group:
    prepared: Any  # PreparedGroup
    future: Future
    size: int = field(default=0)


_STOP = object()


def _resolve(fut: Future, value: Any) -> None:
    if not fut.done():
        try:
            fut.set_result(value)
        except Exception:  # noqa: BLE001 - cancelled meanwhile
            pass


class Batcher:
    def __init__(self, model, *, max_batch_tokens: int, max_batch_items: int, max_wait_ms: float, max_queue_items: int, metrics: Metrics):
        self.model = model
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_items = max_batch_items
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue_items = max_queue_items
        self.metrics = metrics
        self._ready: "queue.Queue[Any]" = queue.Queue()
        self._held: deque = deque()
        self._lock = threading.Lock()
        self._admitted = 0
        self._thread = threading.Thread(target=self._loop, name="nvrm-scorer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ admission

    @property
    def depth(self) -> int:
        return self._admitted

    def try_admit(self, n: int) -> bool:
        with self._lock:
            if self._admitted + n > self.max_queue_items:
                return False
            self._admitted += n
            return True

    def _release(self, n: int) -> None:
        with self._lock:
            self._admitted -= n

    # ------------------------------------------------------------ submission (call after try_admit)

    def submit(self, prompt: str, context: Any, candidate: Any) -> Future:
        """One item; the future resolves to a ScoreResult or an NvrmError."""
        fut: Future = Future()
        fut.add_done_callback(lambda _: self._release(1))

        def prepared(job: Future) -> None:
            try:
                item = job.result()
            except Exception as e:  # noqa: BLE001 - bad input or a bug: either way, this item's answer
                _resolve(fut, unexpected(e))
                return
            self._ready.put(_Single(item, fut, item.encoded.num_tokens))

        self.model.engine.submit_item(prompt, context, candidate).add_done_callback(prepared)
        return fut

    def submit_group(self, prompt: str, context: Any, candidates: Sequence[Any]) -> Future:
        """A group; the future resolves to a list with one ScoreResult or NvrmError per
        candidate (every slot carries the context's error when the context is unusable)."""
        fut: Future = Future()
        n = len(candidates)
        fut.add_done_callback(lambda _: self._release(n))

        def prepared(job: Future) -> None:
            try:
                group = job.result()
            except Exception as e:  # noqa: BLE001
                _resolve(fut, [unexpected(e)] * n)
                return
            self._ready.put(_Group(group, fut, n))

        self.model.engine.submit_group(prompt, context, candidates).add_done_callback(prepared)
        return fut

    # ------------------------------------------------------------ scorer thread

    def stop(self, timeout: float | None = None) -> None:
        """Finish what is queued, then stop the scorer thread."""
        self._ready.put(_STOP)
        self._thread.join(timeout)

    def _next(self, timeout: float | None):
        if self._held:
            return self._held.popleft()
        return self._ready.get(timeout=timeout) if timeout is None or timeout > 0 else self._ready.get_nowait()

    def _loop(self) -> None:
        while True:
            item = self._next(None)
            if item is _STOP:
                return
            if isinstance(item, _Group):
                self._run_group(item)
                continue
            if item.future.done():  # timed out / cancelled before scoring
                continue
            batch = [item]
            tokens = item.tokens
            deadline = time.perf_counter() + self.max_wait
            stop_after = False
            while len(batch) < self.max_batch_items and tokens < self.max_batch_tokens:
                if self._ready.empty() and not self._held and self.depth <= len(batch):
                    break  # nothing else admitted: waiting could only add latency
                try:
                    nxt = self._next(deadline - time.perf_counter())
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop_after = True
                    break
                if isinstance(nxt, _Group) or tokens + nxt.tokens > self.max_batch_tokens:
                    self._held.append(nxt)
                    break
                if not nxt.future.done():
                    batch.append(nxt)
                    tokens += nxt.tokens
            self._run_singles(batch, tokens)
            if stop_after:
                while self._held:  # drain what was held back, then stop
                    held = self._held.popleft()
                    if isinstance(held, _Group):
                        self._run_group(held)
                    else:
                        self._run_singles([held], held.tokens)
                return

    def _run_singles(self, batch: list[_Single], tokens: int) -> None:
        t = time.perf_counter()
        try:
            results: list[Any] = self.model.score_prepared([b.prepared for b in batch])
        except Exception:  # noqa: BLE001 - retry one by one so one item cannot sink the rest
            log.warning("a batch of %d failed; retrying item by item", len(batch), exc_info=True)
            results = []
            for b in batch:
                try:
                    results.append(self.model.score_prepared([b.prepared])[0])
                except NvrmError as e:
                    results.append(e)
                except Exception as e:  # noqa: BLE001
                    results.append(unexpected(e))
        self.metrics.forward.observe(time.perf_counter() - t, kind="batch")
        self.metrics.batch_size.observe(len(batch))
        self.metrics.batch_tokens.observe(tokens)
        for b, r in zip(batch, results):
            self.metrics.items.inc(outcome="error" if isinstance(r, Exception) else "ok")
            _resolve(b.future, r)

    def _run_group(self, g: _Group) -> None:
        if g.future.done():
            return
        t = time.perf_counter()
        try:
            out = self.model.score_prepared_group(g.prepared)
        except Exception as e:  # noqa: BLE001
            log.warning("a group failed unexpectedly", exc_info=True)
            out = [unexpected(e)] * g.size
        self.metrics.forward.observe(time.perf_counter() - t, kind="group")
        self.metrics.batch_size.observe(len(g.prepared.good))
        for r in out:
            self.metrics.items.inc(outcome="error" if isinstance(r, Exception) else "ok")
        _resolve(g.future, out)
