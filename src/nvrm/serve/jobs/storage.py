"""Where jobs are kept, as the job service sees it: ``JobStorage``, chosen once when the app starts (``LocalJobs``
in this process, ``SharedJobs`` in Redis for every replica), and ``JobRecord``, a job as either holds it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ..http.messages import Reply

@dataclass(frozen=True)
class JobRecord:
    """A job as either store holds it."""

    id: str
    kind: str
    """Its kind's name, then ``:`` and its variant when it has one (``v1:score``, ``v1:group``, ``cosmos``)."""
    done: bool
    result: dict[str, Any] | None = None
    """Its outcome (``JobKind.run``'s JSON), once done."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What its kind noted when it was submitted (``JobKind.extra``)."""
    evicted: str | None = None
    """Why its result is no longer kept (answered 507, never a 404 for an accepted job)."""
    failed: str | None = None
    """Why no replica could score it (the Redis store: a poison job, or nobody serves what it asked for)."""
    code: str | None = None
    """The error code of ``failed``."""


class JobStorage(ABC):
    """Admission, queueing and fetching of jobs; the job service (``job_service.JobService``) runs the same steps over
    either kind of storage."""

    holder: str = "this server"
    """Who holds its jobs, in a 404's words."""
    own_contexts: bool = True
    """Whether a submitted body may name this replica's uploaded contexts (False: any replica may score it)."""

    @abstractmethod
    async def admit(self) -> "str | Reply":
        """A new job's id, counted from now (before its body is read), or the refusal (full, or the store is down)."""

    @abstractmethod
    async def release(self, job_id: str) -> None:
        """Give back an admission whose job never started (its body was refused)."""

    @abstractmethod
    async def start(self, job_id: str, kind: Any, variant: str, job: Any, raw: bytes, content_type: str, need: int) -> Reply:
        """Start (or queue) the parsed ``job`` of ``kind`` in the place ``admit`` held, holding ``need`` bytes while it
        runs: the submit's answer (200, or why not now)."""

    @abstractmethod
    async def get(self, job_id: str) -> "JobRecord | None | Reply":
        """The job (None when unknown or expired; a ``Reply`` when the store is down)."""

    @abstractmethod
    async def fetched(self, job_id: str) -> None:
        """Note that the job's result reached a client (it may be evicted without a marker from now on)."""

    @abstractmethod
    async def stats(self) -> "dict[str, Any] | Reply":
        """How many jobs are held and pending (cosmos-rl's ping), or a ``Reply`` when the store is down."""

    def start_worker(self) -> None:
        """Once the model is installed: start taking queued jobs (a Redis store's worker; nothing here)."""

    @abstractmethod
    def close(self) -> None:
        """At shutdown: stop running or taking jobs."""
