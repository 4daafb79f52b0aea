"""Jobs every replica answers (``--job-store redis://HOST:PORT/DB``): the ``JobStorage`` over Redis, and the queue worker.

    submit ─► admit (counted in Redis from now) ─► read and check the body (400 here, as in one process)
           ─► queue the body in Redis ─► the kind's accepted answer ({"id"} / {"uuid", "replica_id"})
    every replica's worker ─► take a job (and the rest of its group) on a lease ─► its kind parses and runs it here
           ─► keep the outcome (first one wins; a late duplicate is dropped and counted)
    fetch / pull (any replica) ─► the outcome from Redis: the same JSON the in-process storage keeps

A job asks for the digests of the weights serving the models it names when it is submitted (what its answer names as
their revisions); a replica takes only jobs it serves those for, or weights a model swap (on any replica, by any route:
``PUT /v1/models``, ``--watch``, ``nvrm refresh --serve``) put in their place, and then the answer says so
(``accepted_revision``). A replica that dies stops renewing its leases; its jobs go back to the queue and another
replica scores them, at most ``--job-attempts`` times: then the job fails with the reason. Redis unreachable: 503
``job_store_unavailable`` with ``Retry-After`` (full: ``job_store_full``), and the next request after it comes back
works again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from typing import Any

from prometheus_client import Counter

from ...errors import RequestError, Unavailable
from ...protocol import ErrorCode
from ..http.messages import Reply
from .kinds import failure
from .redis_store import RETRY_AFTER_S, RedisJobStore, Taken
from .storage import JobRecord, JobStorage

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How often an idle worker looks at the queue again."""
REPLACE_LOAD_S = 600.0
"""How long, beyond --drain-timeout-s, a taken job waits for ``--swap-mode replace`` to load its model."""


class SwapLog:
    """This replica's model swaps (name, old digest, new digest) not yet recorded in Redis: the worker's next take does."""

    def __init__(self):
        self._lock = threading.Lock()
        self._swaps: list[tuple[str, str, str]] = []

    def add(self, name: str, old: str, new: str) -> None:
        """Note a swap (``models.Registry.switched`` calls it)."""
        with self._lock:
            self._swaps.append((name, old, new))

    def pending(self) -> list[tuple[str, str, str]]:
        """The swaps not yet recorded (``recorded`` drops them once they are)."""
        with self._lock:
            return list(self._swaps)

    def recorded(self, n: int) -> None:
        """The first ``n`` of ``pending()`` are in Redis now."""
        with self._lock:
            del self._swaps[:n]



class SharedJobs(JobStorage):
    """Jobs kept in Redis, which any replica answers, and this replica's worker scoring those it takes."""

    holder = "this service"
    own_contexts = False  # whichever replica takes a job may not hold this one's uploaded contexts: they travel inline

    def __init__(self, service):
        self.service, self.serving = service, service.serving
        c = self.serving.config
        self.store = RedisJobStore(c.job_store, c.job_namespace, max_jobs=c.max_jobs, ttl_s=c.job_ttl_s,
                                   max_result_bytes=int(c.max_job_results_mb * 2**20), lease_s=c.job_lease_s,
                                   admit_grace_s=c.body_timeout_s + 60, attempts=c.job_attempts)
        r = self.serving.metrics.registry
        self.duplicates = Counter("nvrm_job_duplicate_results", "Job results dropped: another replica had finished the job first",
                                  registry=r)
        self.taken = Counter("nvrm_jobs_taken", "Jobs this replica took from the shared queue (retried ones included)", registry=r)
        self.name = c.replica_id or self.serving.replica
        self.worker: QueueWorker | None = None
        self.swaps = SwapLog()
        self.serving.registry.switched.append(self.swaps.add)

    # ------------------------------------------------------------ lifecycle

    def start_worker(self) -> None:
        """Start taking jobs from the shared queue (once the model is installed)."""
        if self.worker is None:
            self.worker = QueueWorker(self)
            self.worker.start()

    def close(self) -> None:
        """Stop the worker (jobs it still holds go back to the queue when their leases expire)."""
        if self.worker is not None:
            self.worker.stop()

    def digests(self, *, serving: bool = False) -> dict[str, str]:
        """{model name: weights digest} of this replica's models (``serving``: only those that take requests now, not one
        ``--swap-mode replace`` is loading)."""
        return self.serving.registry.digests(serving=serving)

    def wanted(self, names: list[str | None]) -> dict[str, str]:
        """What a job scored by the models ``names`` (None: the default) asks for: the digests serving them now."""
        digests = self.digests()
        default = next(iter(digests), None)
        return {n: digests[n] for n in [n or default for n in (names or [None])] if n in digests}

    async def call(self, fn, *args, **kw):
        """``fn(*args, **kw)`` on the store, off the event loop."""
        return await asyncio.to_thread(fn, *args, **kw)

    def down(self, e: Unavailable) -> Reply:
        """The 503 a store failure is answered with."""
        self.serving.metrics.rejected.labels(reason=e.code).inc()
        return Reply.error(ErrorCode(e.code), str(e), {"Retry-After": str(RETRY_AFTER_S)})

    # ------------------------------------------------------------ JobStorage

    async def admit(self) -> "str | Reply":
        job_id = uuid.uuid4().hex
        try:
            why = await self.call(self.store.admit, job_id)
        except Unavailable as e:
            return self.down(e)
        if why is not None:
            self.serving.metrics.rejected.labels(reason="jobs_full").inc()
            return Reply.error(ErrorCode.OVERLOADED, why, {"Retry-After": "1"})
        return job_id

    async def release(self, job_id: str) -> None:
        with contextlib.suppress(Unavailable):
            await self.call(self.store.release, job_id)

    async def start(self, job_id: str, kind: Any, variant: str, job: Any, raw: bytes, content_type: str, need: int) -> Reply:
        label = f"{kind.name}:{variant}" if variant else kind.name
        try:
            if not await self.call(self.store.enqueue, job_id, label, kind.group(job), kind.extra(job), raw, content_type,
                                   self.wanted(kind.models(job))):
                raise Unavailable("job store", f"the admission of job {job_id} was lost (Redis restarted?); submit it again", 503,
                                  ErrorCode.JOB_STORE_UNAVAILABLE)
        except Unavailable as e:
            return self.down(e)
        return Reply(200, kind.accepted(job_id))

    async def get(self, job_id: str) -> "JobRecord | None | Reply":
        try:
            job = await self.call(self.store.get, job_id)
        except Unavailable as e:
            return self.down(e)
        if job is None:
            return None
        return JobRecord(job_id, job.get("kind", ""), job["state"] == "done", job.get("result"), job.get("extra") or {},
                         job.get("evicted") or None, job.get("failed") or None, job.get("code"))

    async def fetched(self, job_id: str) -> None:
        await asyncio.to_thread(self.store.mark_fetched, job_id)

    async def stats(self) -> "dict[str, Any] | Reply":
        try:
            held, pending, queued = await self.call(self.store.stats) if self.serving.model is not None else (0, 0, 0)
        except Unavailable as e:
            return self.down(e)
        return {"jobs": held, "pending": pending, "queued": queued, "replica": self.name}

    # ------------------------------------------------------------ scoring a taken job

    async def execute(self, taken: Taken) -> dict[str, Any]:
        """Score a job taken from the queue, here: the outcome its fetch answers (a failure included)."""
        kind = self.service.kind_of(taken.kind)
        if kind is None:  # a kind this replica does not register (another version's): it fails, saying so
            return {"status": "failed", "error": {"code": ErrorCode.INTERNAL, "message": f"job {taken.id}: kind {taken.kind!r} is unknown here"}}
        try:
            await self._until_served()
            ctx = self.serving.parse_context()
            job = await asyncio.to_thread(kind.parse, ctx, taken.body, taken.content_type, taken.kind.partition(":")[2])
            for name in kind.models(job):
                await self._until_served(name)
            async with self._reserved(len(taken.body) + kind.need(job)):
                outcome = await self.service.run(kind, job)
        except Exception as e:  # noqa: BLE001 - a job always ends with an outcome
            return failure(kind, taken.extra, e)
        kind.note_swap(outcome, taken.want)
        return outcome

    @contextlib.asynccontextmanager
    async def _reserved(self, need: int):
        budget = self.serving.budget
        if need > budget.max_bytes:
            raise RequestError("job", f"it needs up to {need} bytes, more than --max-inflight-mb allows on this replica "
                               f"({budget.max_bytes})", 413, ErrorCode.TOO_LARGE)
        while not budget.try_reserve(need):  # this replica is busy: the job waits here, its lease renewed
            await asyncio.sleep(POLL_S)
        try:
            yield
        finally:
            budget.release(need)

    async def _until_served(self, name: str | None = None) -> None:
        """Wait while ``--swap-mode replace`` loads the default model (or ``name``): an accepted job is scored once it is
        back, never failed for the swap. Bounded by the drain and a load (then the job fails with the reason)."""
        registry = self.serving.registry
        deadline = time.monotonic() + self.serving.config.drain_timeout_s + REPLACE_LOAD_S

        def loading() -> bool:
            if self.serving.model is None:
                return True
            return bool(registry.names) and (name or registry.names[0]) in registry.replacing

        while loading() and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)


class QueueWorker:
    """A thread with its own event loop: takes jobs from the shared queue, scores them, renews their leases."""

    def __init__(self, shared: SharedJobs):
        self.shared, self.store = shared, shared.store
        self.stopping = threading.Event()
        self.active: dict[str, asyncio.Task] = {}
        self.thread = threading.Thread(target=lambda: asyncio.run(self._loop()), name="nvrm-job-worker", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop taking jobs; wait up to ``timeout`` s for the thread."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout)

    async def _loop(self) -> None:
        serving = self.shared.serving
        while serving.scheduler is None and not self.stopping.is_set():
            await asyncio.sleep(0.1)
        renew = asyncio.create_task(self._renew())
        room = serving.config.job_workers
        down_since = None
        while not self.stopping.is_set():
            free, scheduler = room - len(self.active), serving.scheduler
            if free <= 0 or scheduler is None or scheduler.draining:  # None: --swap-mode replace is loading the default model
                await asyncio.sleep(POLL_S)
                continue
            try:
                swaps = self.shared.swaps.pending()
                taken = await self.shared.call(self.store.take, self.shared.name, free, served=self.shared.digests(serving=True),
                                               holds=self.shared.digests(), links=swaps)
                self.shared.swaps.recorded(len(swaps))
                down_since = None
            except Unavailable as e:
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning("job worker: %s", e)
                await asyncio.sleep(1.0)
                continue
            except Exception:  # noqa: BLE001 - the worker outlives any one failure
                log.exception("job worker: taking jobs failed")
                await asyncio.sleep(1.0)
                continue
            for job in taken:
                self.shared.taken.inc()
                task = asyncio.create_task(self._run(job))
                self.active[job.id] = task
                task.add_done_callback(lambda _t, i=job.id: self.active.pop(i, None))
            if not taken:
                await asyncio.sleep(POLL_S)
        renew.cancel()

    async def _renew(self) -> None:
        every = self.store.lease_s / 3
        while True:
            await asyncio.sleep(every)
            try:  # also says this replica is alive, and what it serves
                await self.shared.call(self.store.renew, list(self.active), self.shared.digests())
            except Unavailable:
                pass  # Redis is down: the take loop says so; the leases are renewed once it is back
            except Exception:  # noqa: BLE001 - renewing outlives any one failure (a lapse hands the jobs out again)
                log.exception("job worker: renewing leases failed")

    async def _run(self, job: Taken) -> None:
        result = await self.shared.execute(job)
        deadline = time.monotonic() + max(60.0, 2 * self.store.lease_s)
        while True:  # keep it, across a Redis outage
            try:
                kept = await self.shared.call(self.store.finish, job.id, result)
                break
            except Unavailable:
                if self.stopping.is_set() or time.monotonic() > deadline:
                    log.warning("job %s: its result could not be kept (Redis unavailable); it is scored again once its lease "
                                "expires", job.id)
                    return
                await asyncio.sleep(1.0)
        if kept == 0:
            self.shared.duplicates.inc()
        elif kept < 0:
            log.warning("job %s finished after it was dropped from the store (expired, or Redis restarted); result discarded", job.id)
