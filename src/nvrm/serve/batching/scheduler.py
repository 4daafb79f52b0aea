"""Dynamic batching across requests, with shared contexts and deadlines.

Request handlers only admit work and await futures. Preparation runs in the
model's engine (the contract and encoding, in its workers); a context seen
before is taken from the ``ContextCache``. Prepared items land on a queue that
one scorer thread drains: it takes the first ready item, waits up to
``max_wait_ms`` for more (from any request), then

- items that share a prompt and a context (by content) run as one group with
  prefix reuse, even when they came in separate requests; the prefilled
  context is kept (``PrefixCache``), so items of that context in later batches
  run only their own tokens, and a batch's only item is prefilled the same way;
- the others run as padded, token-budgeted batches;
- a group request runs as its own group;
- an item whose request has already timed out is dropped before its forward.

Every admitted item gets exactly one result (a ScoreResult or an error), so
nothing is lost or duplicated; admission is bounded (HTTP 503 beyond it). On
shutdown the queue drains until a deadline, after which what is left is
answered "shutting down" rather than left hanging.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import defaultdict, deque
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...engine import PreparedGroup
from ...engine.workers import unexpected
from ...errors import Expired, ShuttingDown
from .contexts import ContextCache, PrefixCache
from .execution import Execution, resolve as _resolve
from ..admission.media import Media
from ..metrics import Metrics

log = logging.getLogger(__name__)


class Admitted(Future):
    """A request's future (a ScoreResult or error, or one per candidate), with ``settled``: done once the
    scheduler holds nothing of the request any more (its preparation has finished and its prepared
    item was scored or dropped), however the request itself was answered. ``settled`` references none of
    the preparation's results, so a request answered 504 can keep its bytes counted until then
    (``ByteBudget.hold_until_done``) without keeping them alive."""

    def __init__(self) -> None:
        super().__init__()
        self.settled: Future = Future()


@dataclass
class _Single:
    item: Any  # PreparedItem
    key: tuple[str, str] | None  # (prompt, context key): items sharing it can share a prefix
    future: Future
    deadline: float
    exact: bool
    settled: Future  # set once the scorer is done with it (scored or dropped)


@dataclass
class _Group:
    prepared: PreparedGroup
    future: Future
    size: int
    deadline: float
    exact: bool
    settled: Future


_STOP = object()


def _error_of(f: Future) -> BaseException | None:
    """A done future's error (a ``CancelledError`` when it was cancelled), without raising it here."""
    return CancelledError() if f.cancelled() else f.exception()


def _when_all(futures: Sequence[Future], then: Callable[[list[Any]], None], fail: Callable[[BaseException], None]) -> None:
    """Call ``then(results)`` once every future is done, or ``fail(error)`` on the first failure.

    A future keeps its callbacks once done, so the callback reaches the futures only through ``box``,
    emptied when the last one is done: no reference cycle (future -> callback -> futures) keeps their
    results (prepared frames) alive until a full garbage collection. Nothing is raised here either, so no
    traceback holds this frame."""
    left = [len(futures)]
    lock = threading.Lock()
    box = list(futures)

    def done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
            mine = box[:]
            box.clear()
        for f in mine:
            if (e := _error_of(f)) is not None:
                fail(e)
                return
        then([f.result() for f in mine])

    for f in futures:
        f.add_done_callback(done)


class Scheduler:
    def __init__(
        self,
        model,
        *,
        max_batch_items: int,
        max_wait_ms: float,
        max_queue_items: int,
        metrics: Metrics,
        cache: ContextCache,
        share_wait_ms: float = 50.0,
        prefixes: PrefixCache | None = None,
    ):
        self.model = model
        self.engine = model.engine
        self.max_batch_items = max_batch_items
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue_items = max_queue_items
        self.metrics = metrics
        self.cache = cache
        self.share_wait = share_wait_ms / 1000.0
        self.prefixes = prefixes or PrefixCache(0)
        self._preparing: dict[Any, int] = defaultdict(int)  # (prompt, context key) -> items still being prepared
        self._ready: "queue.Queue[Any]" = queue.Queue()
        self._held: deque = deque()
        self._lock = threading.Lock()
        self._admitted = 0
        self._open: dict[Future, int] = {}  # open future -> its number of slots (0: a single item)
        self.draining = False
        self.execution = Execution(model, metrics, self.prefixes)
        self._thread = threading.Thread(target=self._loop, name="nvrm-scorer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ admission

    @property
    def depth(self) -> int:
        return self._admitted

    def try_admit(self, n: int) -> bool:
        """Admit ``n`` items, unless that would pass ``max_queue_items``.

        During a drain requests are still admitted: the server has stopped taking
        connections, so what reaches a handler was already in flight; the drain
        deadline bounds them all.
        """
        with self._lock:
            if self._admitted + n > self.max_queue_items:
                return False
            self._admitted += n
            return True

    def _track(self, fut: Future, n: int, group: bool) -> None:
        with self._lock:
            self._open[fut] = n if group else 0

        def done(f: Future) -> None:  # the future as its argument, not a closure: no cycle through its callbacks
            with self._lock:
                self._admitted -= n
                self._open.pop(f, None)

        fut.add_done_callback(done)

    def _context(self, media: Media) -> Future:
        return self.cache.get_or_prepare(media.key, lambda: self.engine.submit_video(media.value, "context"))

    # ------------------------------------------------------------ submission (after try_admit)

    def submit(self, prompt: str, context: Media, candidate: Media, *, deadline: float, exact: bool = False) -> Admitted:
        """One item; the future resolves to a ScoreResult or an NvrmError."""
        fut = Admitted()
        release = fut.settled
        self._track(fut, 1, group=False)
        key = (prompt, context.key) if self.cache.enabled and not exact else None
        if key is not None:
            with self._lock:
                self._preparing[key] += 1
        parts = [self._context(context), self.engine.submit_video(candidate.value, "candidate")]

        settled = [key is None]

        def prepared_one() -> None:
            """Once per item: it is on the ready queue, or answered without getting there."""
            with self._lock:
                if settled[0]:
                    return
                settled[0] = True
                self._preparing[key] -= 1
                if self._preparing[key] <= 0:
                    del self._preparing[key]

        fut.add_done_callback(lambda _: prepared_one())

        def encode(videos: list[Any]) -> None:
            if fut.done():
                _resolve(release, None)
                return
            try:
                job = self.engine.submit_item(prompt, videos[0], videos[1])  # text and positions only: videos are ready
            except RuntimeError:  # the engine closed: the server is going down
                _resolve(fut, ShuttingDown())
                _resolve(release, None)
                return
            job.add_done_callback(lambda j: queued(j))

        def queued(job: Future) -> None:
            if fut.done() or (e := _error_of(job)) is not None:  # answered meanwhile (timed out, shut down), or failed
                if not fut.done():
                    _resolve(fut, unexpected(e))
                _resolve(release, None)
                return
            self._ready.put(_Single(job.result(), key, fut, deadline, exact, release))
            prepared_one()

        def failed(e: BaseException) -> None:
            if not fut.done():
                _resolve(fut, unexpected(e))
            _resolve(release, None)

        _when_all(parts, encode, failed)
        return fut

    def submit_group(self, prompt: str, context: Media, candidates: Sequence[Media], *, deadline: float, exact: bool = False) -> Admitted:
        """A group; the future resolves to one ScoreResult or NvrmError per candidate
        (every slot carries the context's error when the context is unusable)."""
        fut = Admitted()
        release = fut.settled
        n = len(candidates)
        self._track(fut, n, group=True)

        def prepared(job: Future) -> None:
            if fut.done() or (e := _error_of(job)) is not None:
                if not fut.done():
                    _resolve(fut, [unexpected(e)] * n)
                _resolve(release, None)
                return
            self._ready.put(_Group(job.result(), fut, n, deadline, exact, release))

        self.engine.submit_group(prompt, self._context(context), [c.value for c in candidates]).add_done_callback(prepared)
        return fut

    # ------------------------------------------------------------ shutdown

    def begin_drain(self, seconds: float) -> None:
        """Refuse new work; answer what is still open "shutting down" after ``seconds``."""
        with self._lock:
            if self.draining:
                return
            self.draining = True
        # the clock holds the scheduler weakly and ends once it has stopped with nothing open: a Timer holding
        # ``self._give_up`` kept each swapped-out revision (its model, tokenizer and caches) and a thread alive for
        # --drain-timeout-s (issue 54: +72 MB of RSS after 10 swaps in a minute)
        threading.Thread(target=_drain_clock, args=(weakref.ref(self), max(0.0, seconds)), name="nvrm-drain", daemon=True).start()

    def _stopped_idle(self) -> bool:
        """Whether the scorer thread has ended with no request left open (nothing for the drain clock to answer)."""
        with self._lock:
            return not self._thread.is_alive() and not self._open

    def _give_up(self) -> None:
        with self._lock:
            left = list(self._open.items())
        if left:
            log.warning("drain timeout: answering %d open request(s) 'shutting down'", len(left))
        for fut, slots in left:
            _resolve(fut, [ShuttingDown()] * slots if slots else ShuttingDown())

    def stop(self, timeout: float | None = None) -> bool:
        """Finish what is queued, then stop the scorer thread; False if it (or a forward thread) is still busy after ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        self._ready.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive() and self.execution.wait(None if end is None else max(0.0, end - time.monotonic()))

    # ------------------------------------------------------------ scorer thread

    def _next(self, timeout: float | None):
        if self._held:
            return self._held.popleft()
        return self._ready.get(timeout=timeout) if timeout is None or timeout > 0 else self._ready.get_nowait()

    def _live(self, work) -> bool:
        """Whether ``work`` still needs scoring (its request neither answered nor past its deadline);
        work that does not is let go (``settled``)."""
        if not work.future.done() and time.monotonic() > work.deadline:
            self.metrics.expired.inc(getattr(work, "size", 1))
            _resolve(work.future, Expired() if isinstance(work, _Single) else [Expired()] * work.size)
        if work.future.done():
            _resolve(work.settled, None)
            return False
        return True

    def _run(self, works: list[Any]) -> None:
        """Score ``works`` (one group, or single items batched), then let them go (``settled``; ``Execution.run``)."""
        self.execution.run(works, group=len(works) == 1 and isinstance(works[0], _Group))

    def _loop(self) -> None:
        while True:
            work = batch = nxt = None  # nothing of the last batch stays alive while the scorer waits
            work = self._next(None)
            if work is _STOP:
                return
            if not self._live(work):
                continue
            if isinstance(work, _Group):
                self._run([work])
                continue
            batch = [work]
            start = time.monotonic()
            stop_after = False
            while len(batch) < self.max_batch_items:
                if self._ready.empty() and not self._held and self.depth <= len(batch):
                    break  # nothing else admitted: waiting could only add latency
                # items of a context already in this batch that are still being prepared are worth
                # waiting for a little longer: they will share its prefix
                sharing = any(self._preparing.get(b.key, 0) > 0 for b in batch if b.key is not None)
                deadline = start + (max(self.max_wait, self.share_wait) if sharing else self.max_wait)
                try:
                    nxt = self._next(deadline - time.monotonic())
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop_after = True
                    break
                if isinstance(nxt, _Group):
                    self._held.append(nxt)
                    break
                if self._live(nxt):
                    batch.append(nxt)
            self._run(batch)
            if stop_after:
                while self._held:  # drain what was held back, then stop
                    held = self._held.popleft()
                    if self._live(held):
                        self._run([held])
                return


DRAIN_CLOCK_TICK_S = 0.5
"""How often a draining scheduler's clock looks whether it has stopped with nothing open (and ends early)."""


def _drain_clock(scheduler: "weakref.ReferenceType[Scheduler]", seconds: float) -> None:
    """``Scheduler.begin_drain``'s deadline: after ``seconds``, what is still open is answered "shutting down"; it ends
    sooner once the scheduler is gone or has stopped with nothing open."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(DRAIN_CLOCK_TICK_S, left))
        s = scheduler()
        if s is None or s._stopped_idle():
            return
        del s
    s = scheduler()
    if s is not None:
        s._give_up()
