"""The service's asynchronous side: submit a job now, fetch its answer later, by kind (``kinds.JobKind``).

    submit ─► room in the store (counted before the body is read) ─► read the body under its reservation
           ─► the kind parses it (a thread) ─► what it needs fits in --max-inflight-mb? ─► the storage starts it
              (here: a task holding its bytes until it finishes; Redis: queued for whichever replica takes it)
    fetch  ─► the record ─► unknown: 404 ─► running: the kind's pending answer ─► evicted: 507
           ─► the kind's answer from its outcome (or from why it failed as a whole)

The storage is chosen once, when the app starts (``LocalJobs`` or ``SharedJobs``); the steps above are the same over
both, and a job's outcome is the same JSON in both. An accepted job always ends with an outcome: a run that raises
ends as its kind's failure, every item saying why.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from ...protocol import ErrorCode
from ..http.messages import PendingBody, Reply
from ..serving import Serving
from .kinds import JobKind, failure
from .storage import JobStorage

class JobService:
    """Submit and fetch jobs of every registered kind over one storage."""

    def __init__(self, serving: Serving):
        self.serving = serving
        self.kinds: dict[str, JobKind] = {}
        if serving.config.job_store == "memory":
            from .local_store import LocalJobs

            self.storage: JobStorage = LocalJobs(serving, self.run)
        else:
            from .shared_jobs import SharedJobs

            self.storage = SharedJobs(self)

    def register(self, kind: JobKind) -> None:
        """Take jobs of ``kind`` from now on (a protocol registers its own)."""
        self.kinds[kind.name] = kind

    def kind_of(self, label: str) -> JobKind | None:
        """The kind of a stored job (its label is the kind's name, then ``:`` and a variant)."""
        return self.kinds.get(label.partition(":")[0])

    async def run(self, kind: JobKind, job: Any) -> dict[str, Any]:
        """``job`` scored: its kind's outcome, or, when that raised, its kind's failure."""
        try:
            return await kind.run(job)
        except Exception as e:  # noqa: BLE001 - a job always ends with an outcome
            return failure(kind, kind.extra(job), e)

    async def submit(self, name: str, body: PendingBody, variant: str = "") -> Reply:
        """A job of kind ``name`` (``variant``: which of its forms, e.g. ``score`` or ``group``), checked and started; its
        kind's accepted answer, or the refusal (400 naming the input, 413, 503 with a reason)."""
        kind, serving, storage = self.kinds[name], self.serving, self.storage
        if (busy := serving.not_ready()) is not None:
            return busy
        job_id = await storage.admit()
        if isinstance(job_id, Reply):
            return job_id

        async def parsed(raw: bytes, reserved: int) -> Reply:
            ctx = serving.parse_context(own_contexts=storage.own_contexts)
            job = await asyncio.to_thread(kind.parse, ctx, raw, body.content_type, variant)
            need = reserved + kind.need(job)
            if (refused := serving.too_large("job", need)) is not None:
                return refused
            return await storage.start(job_id, kind, variant, job, raw, body.content_type, need)

        reply = None
        try:
            reply = await serving.with_body(body, kind.body_name, parsed)
            return reply
        finally:
            if reply is None or reply.status != 200:
                await storage.release(job_id)

    async def fetch(self, name: str, job_id: str, query: str = "") -> Reply:
        """A job of kind ``name``'s answer: the kind's pending answer while it runs, then its outcome (``query``: what the
        fetch asks for, e.g. a cosmos-rl pull's type); 404 once unknown or expired, 507 when its result was not kept."""
        kind = self.kinds[name]
        record = await self.storage.get(job_id)
        if isinstance(record, Reply):
            return record
        if record is None or self.kind_of(record.kind) is not kind:
            return Reply.error(ErrorCode.JOB_UNKNOWN, f"{kind.noun} {job_id[:40]} is not held by {self.storage.holder} (unknown, or its "
                               "result expired after --job-ttl-s)")
        if (refused := kind.refuse_query(query)) is not None:
            return refused
        if not record.done:
            return kind.pending(record)
        if record.evicted:  # accepted, so never a 404: its result could not be kept
            return Reply.error(ErrorCode.TOO_LARGE, f"{kind.noun} {record.id}: {record.evicted}", status=507)
        await self.storage.fetched(job_id)
        if record.failed:  # no outcome: every item says why, none is lost
            code = ErrorCode.read(record.code) or ErrorCode.INTERNAL
            record = dataclasses.replace(record, result=kind.failed(record.extra, code, f"{kind.noun} {record.id}: {record.failed}"))
        return kind.answer(record, query)

    async def stats(self) -> "dict[str, Any] | Reply":
        """The storage's counts of jobs held and pending (a ``Reply`` when it is down)."""
        return await self.storage.stats()

    def start(self) -> None:
        """Once the model is installed: the storage starts taking queued jobs (Redis)."""
        self.storage.start_worker()

    def close(self) -> None:
        """At shutdown: stop running and taking jobs."""
        self.storage.close()
