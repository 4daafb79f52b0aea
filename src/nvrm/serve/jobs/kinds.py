"""Kinds of asynchronous work. The job service and its stores know kinds, not protocols: a protocol registers the
kind its jobs are (``JobService.register``), and the kind says how a job is

    parsed   the body -> a typed job (in a thread; on the replica that takes it, again, for the Redis store)
    needs    the bytes it holds while it runs (beyond its body), reserved in the byte budget
    run      scored: its outcome, as the JSON both stores keep (never pickled)
    answered a fetch's answer from that JSON (or from why the job failed as a whole)

``/v1/jobs`` are kind ``V1`` (``protocols.native``), cosmos-rl's enqueue and pull kind ``cosmos``
(``protocols.cosmos.rollout_kind``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

from ...errors import InputError, RequestError, Unavailable
from ...protocol import ErrorCode
from ...results import one_line
from ..admission.requests import ParseContext
from ..http.messages import Reply
from .storage import JobRecord

log = logging.getLogger(__name__)

V1 = "v1"
"""The kind of ``/v1/jobs`` (``jobs.job_routes``): a ``/v1/score`` or ``/v1/score_group`` request run as a job."""


class JobKind(ABC):
    """One kind of job: parse, need, run, answer (and what its submitter is told)."""

    name: str = ""
    """The kind's name, stored with each job."""
    noun: str = "job"
    """What its ids are called in answers (``job``, ``uuid``)."""
    body_name: str = "job body"
    """What its body is called in refusals."""

    @abstractmethod
    def parse(self, ctx: ParseContext, raw: bytes, content_type: str, variant: str) -> Any:
        """The body as a typed job (runs in a worker thread); ``InputError`` names what is wrong (400 at submit)."""

    @abstractmethod
    def need(self, job: Any) -> int:
        """Bytes the job holds while it runs, beyond its body (413 when that could never fit)."""

    @abstractmethod
    async def run(self, job: Any) -> dict[str, Any]:
        """Score the job: its outcome, as JSON."""

    @abstractmethod
    def failed(self, extra: dict[str, Any], code: ErrorCode | str, message: str) -> dict[str, Any]:
        """The outcome of a job that failed as a whole (every item says why; none is lost)."""

    @abstractmethod
    def answer(self, record: JobRecord, query: str) -> Reply:
        """A fetch's answer to a finished job whose outcome is kept (``query``: what the fetch asked for)."""

    def accepted(self, job_id: str) -> dict[str, Any]:
        """The submit's answer."""
        return {"id": job_id, "status": "pending"}

    def pending(self, record: JobRecord) -> Reply:
        """A fetch's answer while the job runs."""
        return Reply(202, {"id": record.id, "status": "pending"}, {"Retry-After": "1"})

    def refuse_query(self, query: str) -> Reply | None:
        """A fetch's answer when ``query`` asks for what this server never computes; None when it may."""
        return None

    def models(self, job: Any) -> list[str | None]:
        """The served models that score the job (None: the default)."""
        return [None]

    def group(self, job: Any) -> str:
        """Jobs of one group are taken from the Redis queue together (they share a prefill); "" for none."""
        return ""

    def extra(self, job: Any) -> dict[str, Any]:
        """What to note with the job at submit (read back by ``failed``)."""
        return {}

    def note_swap(self, outcome: dict[str, Any], asked: dict[str, str]) -> None:
        """Say in ``outcome`` when a model swap put other weights in the place of those the job was accepted for
        (``asked``: {model name: digest} at submit)."""


def failure(kind: JobKind, extra: dict[str, Any], e: BaseException) -> dict[str, Any]:
    """The outcome of a job of ``kind`` whose run raised ``e``: its code (the error's own, else 400 for an input error,
    500 for anything else, logged)."""
    code = e.code if isinstance(e, (RequestError, Unavailable)) else ErrorCode.BAD_REQUEST if isinstance(e, InputError) else ErrorCode.INTERNAL
    if not isinstance(e, (InputError, Unavailable)):
        log.error("a %s job failed", kind.name, exc_info=e)
    return kind.failed(extra, code, one_line(e))
