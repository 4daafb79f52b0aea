"""Jobs kept in this process (``--job-store memory``, the default): ``LocalJobStore`` and the ``JobStorage`` over it.

Trainers avoid stalling on reward latency by sending each rollout as it finishes and collecting
the rewards later. A job is accepted only when it fits (its bytes reserved in the service's
budget until it finishes, and room in the store): otherwise 503 with the reason, never a silent
drop. An accepted job always ends with a result (its items' rewards or errors), which is kept
for ``ttl_s`` seconds after it finished, however often it is fetched. The store is bounded in
entries and in the bytes of the results it keeps; only finished jobs are ever evicted.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ...protocol import ErrorCode
from ...results import one_line
from ..http.messages import Reply
from .storage import JobRecord, JobStorage


@dataclass
class LocalJob:
    """One submitted job."""

    id: str
    kind: str
    created: float
    task: "asyncio.Task | None" = None
    result: Any = None
    """What the job produced (its kind's JSON; set when it finishes)."""
    finished: float | None = None
    size: int = 0
    """Bytes its result takes in the store (its JSON)."""
    extra: dict[str, Any] = field(default_factory=dict)
    evicted: str | None = None
    """Why its result is no longer kept (answered 507, never a 404 for an accepted job)."""
    fetched: bool = False
    failed: str | None = None
    """Why it ended without an outcome (its run raised)."""

    @property
    def done(self) -> bool:
        return self.finished is not None

    def record(self) -> JobRecord:
        """The job as the job service reads it."""
        return JobRecord(self.id, self.kind, self.done, self.result, self.extra, self.evicted, self.failed,
                         ErrorCode.INTERNAL if self.failed else None)


class LocalJobStore:
    """Jobs by id: at most ``max_jobs`` of them and ``max_result_bytes`` of results; finished ones live ``ttl_s``."""

    def __init__(self, *, max_jobs: int, ttl_s: float, max_result_bytes: int, clock: Callable[[], float] = time.monotonic):
        self.max_jobs = max_jobs
        self.ttl_s = ttl_s
        self.max_result_bytes = max_result_bytes
        self.clock = clock
        self._jobs: dict[str, LocalJob] = {}
        self._bytes = 0
        self._admitted = 0
        """Jobs counted from their admission, their bodies still being read (not started yet)."""

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def pending(self) -> int:
        return sum(1 for j in self._jobs.values() if not j.done)

    @property
    def bytes(self) -> int:
        return self._bytes

    def room(self) -> str | None:
        """Why no job can be accepted now (None when one can)."""
        self.expire()
        if len(self._jobs) + self._admitted < self.max_jobs:
            return None
        return (f"the job store is full ({len(self._jobs) + self._admitted} jobs, {self.pending + self._admitted} still running; "
                f"--max-jobs {self.max_jobs}); fetch results or retry shortly")

    def admit(self) -> str | None:
        """Count one job from now, before its body is read (None), or the reason there is no room."""
        why = self.room()
        if why is None:
            self._admitted += 1
        return why

    def release(self) -> None:
        """Give back an admission whose job never started (its body was refused)."""
        self._admitted -= 1

    def start(self, kind: str, work: Callable[[], Awaitable[Any]], *, job_id: str | None = None, on_done: Callable[[], None] | None = None,
              **extra: Any) -> LocalJob:
        """Run ``work()`` as a job now (under ``job_id``, default a new one), in the place its ``admit()`` held."""
        self._admitted -= 1
        job = LocalJob(job_id or uuid.uuid4().hex, kind, self.clock(), extra=extra)
        self._jobs[job.id] = job

        async def run() -> None:
            result = None
            try:
                result = await work()
            except Exception as e:  # noqa: BLE001 - a job always ends, with its reason
                job.failed = one_line(e)
            finally:
                if on_done is not None:
                    on_done()
            self._finish(job, result)

        job.task = asyncio.get_running_loop().create_task(run())
        return job

    def _finish(self, job: LocalJob, result: Any) -> None:
        job.result = result
        job.finished = self.clock()
        try:
            job.size = len(json.dumps(result, default=str))
        except (TypeError, ValueError):
            job.size = 256
        if job.size > self.max_result_bytes:
            self._evict(job, f"its result is {job.size} bytes, more than --max-job-results-mb {self.max_result_bytes / 2**20:g} allows; "
                        "send fewer items per job or raise the limit", counted=False)
            return
        self._bytes += job.size
        self.expire()

    def _evict(self, job: LocalJob, why: str, *, counted: bool = True) -> None:
        if counted:
            self._bytes -= job.size
        job.result, job.size, job.evicted = None, 0, why

    def get(self, job_id: str) -> LocalJob | None:
        """The job, or None when unknown or expired."""
        self.expire()
        return self._jobs.get(job_id)

    def expire(self) -> None:
        """Drop finished jobs past their TTL, then the oldest finished results while over the byte bound (one never
        fetched leaves a marker that answers 507)."""
        now = self.clock()
        for jid in [j.id for j in self._jobs.values() if j.done and now - j.finished > self.ttl_s]:  # type: ignore[operator]
            self._drop(jid)
        if self._bytes > self.max_result_bytes:
            for job in sorted((j for j in self._jobs.values() if j.done and j.size), key=lambda j: j.finished):
                if self._bytes <= self.max_result_bytes:
                    break
                if job.fetched:
                    self._drop(job.id)
                else:
                    self._evict(job, f"its result was dropped unfetched to stay under --max-job-results-mb {self.max_result_bytes / 2**20:g}; "
                                "fetch results sooner or raise the limit")

    def _drop(self, job_id: str) -> None:
        job = self._jobs.pop(job_id, None)
        if job is not None:
            self._bytes -= job.size

    def cancel_all(self) -> None:
        """Cancel every job still running (at shutdown)."""
        for job in self._jobs.values():
            if job.task is not None and not job.task.done():
                job.task.cancel()


class LocalJobs(JobStorage):
    """Jobs run as tasks of this process while their submitters go on; each holds its bytes of the service's budget
    (its body and an upper bound of its frames, decoded latents included) until it finishes."""

    def __init__(self, serving, run: Callable[[Any, Any], Awaitable[dict[str, Any]]]):
        c = serving.config
        self.serving, self.run = serving, run
        self.store = LocalJobStore(max_jobs=c.max_jobs, ttl_s=c.job_ttl_s, max_result_bytes=int(c.max_job_results_mb * 1024 * 1024))

    async def admit(self) -> "str | Reply":
        why = self.store.admit()
        if why is not None:
            self.serving.metrics.rejected.labels(reason="jobs_full").inc()
            return Reply.error(ErrorCode.OVERLOADED, why, {"Retry-After": "1"})
        return uuid.uuid4().hex

    async def release(self, job_id: str) -> None:
        self.store.release()

    async def start(self, job_id: str, kind: Any, variant: str, job: Any, raw: bytes, content_type: str, need: int) -> Reply:
        budget = self.serving.budget
        if not budget.try_reserve(need):
            return self.serving.overloaded("job")
        label = f"{kind.name}:{variant}" if variant else kind.name
        self.store.start(label, lambda: self.run(kind, job), job_id=job_id, on_done=lambda: budget.release(need), **kind.extra(job))
        return Reply(200, kind.accepted(job_id))

    async def get(self, job_id: str) -> JobRecord | None:
        job = self.store.get(job_id)
        return None if job is None else job.record()

    async def fetched(self, job_id: str) -> None:
        job = self.store.get(job_id)
        if job is not None:
            job.fetched = True

    async def stats(self) -> dict[str, Any]:
        return {"jobs": len(self.store), "pending": self.store.pending}

    def close(self) -> None:
        self.store.cancel_all()
