"""Jobs every replica answers (``--job-store redis://HOST:PORT/DB``): the HTTP side and the queue worker.

    submit / enqueue ─► admit (counted in Redis from now) ─► read and check the body (400 here, as in one process)
                     ─► queue the body in Redis ─► {"id"} / {"uuid", "replica_id"}
    every replica's worker ─► take a job (and the rest of its group) on a lease ─► parse, score here
                     ─► keep the result (first one wins; a late duplicate is dropped and counted)
    fetch / pull (any replica) ─► the result from Redis: the same JSON the in-memory store answers

A job asks for the revisions serving the models it names when it is submitted (the digests its answer names);
a replica takes only jobs it serves those revisions for, or revisions a model swap (on any replica, by any route:
``PUT /v1/models``, ``--watch``, ``nvrm refresh --serve``) put in their place, and then the answer says so
(``accepted_revision``). A replica that dies stops renewing its leases; its jobs go back to the queue and another
replica scores them, at most ``--job-attempts`` times: then the job fails with the reason. Redis unreachable: 503
``job_store_unavailable`` with ``Retry-After`` (full: ``job_store_full``), and the next request after it comes back
works again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import time
import uuid
from typing import Any

from prometheus_client import Counter

from ...errors import InputError, RequestError, Unavailable
from ...protocol import ErrorCode, error_body
from ...results import one_line
from ..batching.contexts import ContextStore
from ..protocols.cosmos.wire import Rollouts, parse_enqueue
from ..models.registry import DEFAULT_NAME
from .redis_store import RETRY_AFTER_S, RedisJobStore, Taken
from ..admission.requests import parse_work
from ..serving import Reply

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How often an idle worker looks at the queue again."""
REPLACE_LOAD_S = 600.0
"""How long, beyond --drain-timeout-s, a taken job waits for ``--swap-mode replace`` to load its model."""


def rollouts_json(r: Rollouts) -> dict[str, Any]:
    """A cosmos-rl job's outcome as the JSON kept in Redis."""
    return {"rewards": r.rewards, "errors": {str(k): v for k, v in r.errors.items()}, "info": r.info,
            "seconds": r.seconds, "decode_seconds": r.decode_seconds, "models": {n: rollouts_json(m) for n, m in r.models.items()}}


def rollouts_of(d: dict[str, Any]) -> Rollouts:
    """The ``Rollouts`` that ``rollouts_json`` wrote."""
    return Rollouts(d["rewards"], {int(k): v for k, v in d["errors"].items()}, d["info"], d["seconds"], d["decode_seconds"],
                    {n: rollouts_of(m) for n, m in d.get("models", {}).items()})


def v1_json(reply: Reply) -> dict[str, Any]:
    """A ``/v1/jobs`` job's answer (without its id) as kept in Redis: what ``GET /v1/jobs/{id}`` sends."""
    if reply.status == 200:
        return {"status": "done", **reply.body}
    return {"status": "failed", "error": reply.body.get("error")}


class _InlineContexts:
    """``serving`` as a submit parses a job with: a context named by ref is refused (409 ``context_unknown``; nvrm's
    client then sends it inline), because whichever replica takes the job may not hold it. The queued body is whole."""

    def __init__(self, serving, store: ContextStore | None = None):
        self._serving = serving
        self.store = store or ContextStore(0, lambda hit: None)

    def for_payload(self, payload):
        """With several served models, the one the job names parses it, still without this replica's contexts."""
        pick = getattr(self._serving, "for_payload", None)
        return self if pick is None else _InlineContexts(pick(payload), self.store)

    def __getattr__(self, name: str):
        return getattr(self._serving, name)


class SwapLog:
    """This replica's model swaps (name, old revision, new) not yet recorded in Redis: the worker's next take does."""

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


class SharedJobs:
    """``JobService``'s submit, fetch, pull and ping over the Redis store, and this replica's queue worker."""

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
        registry = getattr(self.serving, "registry", None)
        if registry is not None:
            registry.switched.append(self.swaps.add)

    # ------------------------------------------------------------ lifecycle

    def start_worker(self) -> None:
        """Start taking jobs from the shared queue (once the model is installed)."""
        if self.worker is None:
            self.worker = QueueWorker(self)
            self.worker.start()

    def cancel_all(self) -> None:
        """Stop the worker (jobs it still holds go back to the queue when their leases expire)."""
        if self.worker is not None:
            self.worker.stop()

    def revisions(self, *, serving: bool = False) -> dict[str, str]:
        """{model name: revision} of this replica's models (``serving``: only those that take requests now, not one
        ``--swap-mode replace`` is loading)."""
        registry = getattr(self.serving, "registry", None)
        if registry is None:
            m = self.serving.model
            return {} if m is None else {DEFAULT_NAME: str(getattr(m, "revision", None) or "unversioned")}
        return registry.revisions(serving=serving)

    def wanted(self, names) -> dict[str, str]:
        """What a job naming the models ``names`` (None or empty: the default) asks for: the revisions serving them now."""
        revisions = self.revisions()
        default = next(iter(revisions), None)
        return {n: revisions[n] for n in [n or default for n in (names or [None])] if n in revisions}

    async def call(self, fn, *args, **kw):
        """``fn(*args, **kw)`` on the store, off the event loop."""
        return await asyncio.to_thread(fn, *args, **kw)

    def down(self, e: Unavailable) -> Reply:
        """The 503 a store failure is answered with."""
        self.serving.metrics.rejected.labels(reason=e.code).inc()
        return Reply.error(ErrorCode(e.code), str(e), {"Retry-After": str(RETRY_AFTER_S)})

    # ------------------------------------------------------------ submitting

    async def _submit(self, what: str, body, check) -> Reply:
        """Admit one job, read its body, ``check(raw, reserved, job_id)`` it (which queues it) and answer."""
        if (busy := self.serving.not_ready()) is not None:
            return busy
        job_id = uuid.uuid4().hex
        try:
            why = await self.call(self.store.admit, job_id)
        except Unavailable as e:
            return self.down(e)
        if why is not None:
            self.serving.metrics.rejected.labels(reason="jobs_full").inc()
            return Reply.error(ErrorCode.OVERLOADED, why, {"Retry-After": "1"})
        reply = None
        try:
            reply = await self.serving.with_body(body, what, lambda raw, reserved: check(raw, reserved, job_id))
            return reply
        finally:
            if reply is None or reply.status != 200:
                with contextlib.suppress(Unavailable):
                    await self.call(self.store.release, job_id)

    async def _queue(self, job_id: str, kind: str, group: str, extra: dict, raw: bytes, content_type: str, need: int,
                     answer: dict, want: dict[str, str]) -> Reply:
        budget = self.serving.budget
        if need > budget.max_bytes:
            return Reply.error(ErrorCode.TOO_LARGE, f"job: it needs up to {need} bytes, more than --max-inflight-mb allows "
                               f"({budget.max_bytes})")
        try:
            if not await self.call(self.store.enqueue, job_id, kind, group, extra, raw, content_type, want):
                raise Unavailable("job store", f"the admission of job {job_id} was lost (Redis restarted?); submit it again", 503,
                                  ErrorCode.JOB_STORE_UNAVAILABLE)
        except Unavailable as e:
            return self.down(e)
        return Reply(200, answer)

    async def submit(self, kind: str, body) -> Reply:
        """``POST /v1/jobs/score`` (``score_group``): checked here, queued for any replica."""

        async def check(raw: bytes, reserved: int, job_id: str) -> Reply:
            work = await asyncio.to_thread(parse_work, _InlineContexts(self.serving), raw, body.content_type, kind)
            return await self._queue(job_id, f"v1:{kind}", "", {}, raw, body.content_type, reserved + work.prepared_bytes,
                                     {"id": job_id, "status": "pending"}, self.wanted([work.model]))

        return await self._submit("job body", body, check)

    async def enqueue(self, body) -> Reply:
        """``POST /api/reward/enqueue``: checked here (nothing decoded), queued; one prompt's rollouts are taken together."""
        svc = self.service

        async def check(raw: bytes, reserved: int, job_id: str) -> Reply:
            req = await asyncio.to_thread(parse_enqueue, raw, self.serving.model.limits, has_decoder=svc.decoder is not None,
                                          rules=svc.rules())
            group = "c" + hashlib.sha256(json.dumps([req.prompts, req.fps]).encode()).hexdigest()[:24]
            need = reserved + req.decoded_bytes() + svc._frames_bound(req)
            return await self._queue(job_id, "cosmos", group, {"prompts": req.batch}, raw, body.content_type, need,
                                     {"uuid": job_id, **svc.replica_answer()}, self.wanted(list(req.reward_fn)))

        return await self._submit("enqueue body", body, check)

    # ------------------------------------------------------------ answering

    async def _job(self, job_id: str, kind: str, what: str) -> "dict | Reply":
        try:
            job = await self.call(self.store.get, job_id)
        except Unavailable as e:
            return self.down(e)
        if job is None or not job.get("kind", "").startswith(kind):
            return Reply.error(ErrorCode.JOB_UNKNOWN, f"{what} {job_id[:40]} is not held by this service (unknown, or its result "
                               "expired after --job-ttl-s)")
        if job.get("evicted"):
            return Reply.error(ErrorCode.TOO_LARGE, f"{what} {job_id}: {job['evicted']}", status=507)
        return job

    async def fetch(self, job_id: str) -> Reply:
        """``GET /v1/jobs/{id}``, from any replica."""
        job = await self._job(job_id, "v1", "job")
        if isinstance(job, Reply):
            return job
        if job["state"] != "done":
            return Reply(202, {"id": job_id, "status": "pending"}, {"Retry-After": "1"})
        await asyncio.to_thread(self.store.mark_fetched, job_id)
        if job.get("failed"):  # no replica could score it (a poison job, or nobody serves what it asked for)
            return Reply(200, {"id": job_id, "status": "failed", **error_body(ErrorCode.read(job.get("code")) or ErrorCode.INTERNAL,
                                                                              f"job {job_id}: {job['failed']}")})
        return Reply(200, {"id": job_id, **job["result"]})

    async def pull(self, job_id: str, kind: str) -> Reply:
        """``POST /api/reward/pull``, from any replica (with or without cosmos-rl's pinning header)."""
        job = await self._job(job_id, "cosmos", "uuid")
        if isinstance(job, Reply):
            return job
        if (unknown := self.service.unknown_type(kind)) is not None:
            return unknown
        if job["state"] != "done":
            return Reply.error(ErrorCode.NOT_READY, "the rewards are not ready yet; pull again", {"Retry-After": "1"}, status=425)
        await asyncio.to_thread(self.store.mark_fetched, job_id)
        if job.get("failed"):  # every item says why, none is lost
            n = int(job["extra"].get("prompts", 1))
            return self.service.pull_answer(Rollouts([None] * n, {i: f"uuid {job_id}: {job['failed']}" for i in range(n)}), kind)
        return self.service.pull_answer(rollouts_of(job["result"]), kind)

    async def ping(self) -> Reply:
        """cosmos-rl's ping, with the shared store's counts."""
        try:
            held, pending, queued = await self.call(self.store.stats) if self.serving.model is not None else (0, 0, 0)
        except Unavailable as e:
            return self.down(e)
        return Reply(200, {"status": "ok", "ready": self.serving.model is not None, "jobs": held, "pending": pending, "queued": queued,
                           "replica": self.name})

    # ------------------------------------------------------------ scoring a taken job

    async def execute(self, job: Taken) -> dict[str, Any]:
        """Score a job taken from the queue, here: the JSON its fetch or pull answers (a failure included)."""
        try:
            if job.kind == "cosmos":
                return await self._rollouts(job)
            return await self._v1(job)
        except Exception as e:  # noqa: BLE001 - a job always ends with a result
            code = e.code if isinstance(e, (RequestError, Unavailable)) else (
                ErrorCode.BAD_REQUEST if isinstance(e, InputError) else ErrorCode.INTERNAL)
            if not isinstance(e, (InputError, Unavailable)):
                log.exception("job %s failed", job.id)
            if job.kind == "cosmos":
                n = int(job.extra.get("prompts", 1))
                return rollouts_json(Rollouts([None] * n, {i: one_line(e) for i in range(n)}))
            return {"status": "failed", **error_body(code, one_line(e))}

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
        registry = getattr(self.serving, "registry", None)
        deadline = time.monotonic() + self.serving.config.drain_timeout_s + REPLACE_LOAD_S

        def loading() -> bool:
            if self.serving.model is None:
                return True
            return registry is not None and bool(registry.names) and (name or registry.names[0]) in registry.replacing

        while loading() and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)

    async def _rollouts(self, job: Taken) -> dict[str, Any]:
        svc, started = self.service, time.perf_counter()
        await self._until_served()
        req = await asyncio.to_thread(parse_enqueue, job.body, self.serving.model.limits, has_decoder=svc.decoder is not None,
                                      rules=svc.rules())
        async with self._reserved(len(job.body) + req.decoded_bytes() + svc._frames_bound(req)):
            r = await svc._score_rollouts(req, started)
        for name, scored in r.models.items():  # scored by a revision a swap put in the place of the one it asked for: say so
            asked = job.want.get(name)
            if asked is not None and scored.info.get("model_revision") not in (None, asked):
                scored.info["accepted_revision"] = asked
        return rollouts_json(r)

    async def _v1(self, job: Taken) -> dict[str, Any]:
        svc = self.service
        await self._until_served()
        work = await asyncio.to_thread(parse_work, self.serving, job.body, job.content_type, job.kind.partition(":")[2])
        await self._until_served(work.model)
        async with self._reserved(len(job.body) + work.prepared_bytes):
            out = v1_json(await svc.v1_results(work))
        model = out.get("model") if isinstance(out.get("model"), dict) else {}
        asked = job.want.get(model.get("name", ""))
        if asked is not None and model.get("revision") not in (None, asked):  # a swap put another revision in its place
            out["accepted_revision"] = asked
            out["note"] = (f"accepted while model {model.get('name')!r} was at revision {asked}; scored by revision "
                           f"{model['revision']}, which a model swap put in its place")
        return out


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
                taken = await self.shared.call(self.store.take, self.shared.name, free, served=self.shared.revisions(serving=True),
                                               holds=self.shared.revisions(), links=swaps)
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
                await self.shared.call(self.store.renew, list(self.active), self.shared.revisions())
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
