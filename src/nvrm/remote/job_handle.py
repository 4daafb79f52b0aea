"""A job submitted to ``nvrm serve`` (``POST /v1/jobs/...``): fetch its results later, blocking or awaited.

Polling backs off from 50 ms to 1 s (honouring the server's ``Retry-After``); a job the server no
longer holds (unknown, or expired after its ``--job-ttl-s``) is a ``ServiceError``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable
from urllib.parse import quote

from ..errors import ServiceError
from ..protocol import JOB_ID  # any other id in a submit answer is refused: a server's answer never chooses the URL polled


def job_id_of(answer: Any) -> str:
    """The job id of a submit answer (``{"id": ..., "status": "pending"}``), or a ``ServiceError`` naming what is wrong."""
    if not isinstance(answer, dict):
        raise ServiceError(f"the service's job answer is a {type(answer).__name__}, not an object with an id")
    job_id = answer.get("id")
    if not isinstance(job_id, str) or JOB_ID.fullmatch(job_id) is None:
        raise ServiceError(f"the service's job id {str(job_id)[:40]!r} is not 32 hex digits (the ids nvrm serve issues); it is not polled")
    return job_id


class RemoteJob:
    """A submitted request whose results are fetched from ``GET /v1/jobs/{id}``."""

    def __init__(self, client, job_id: str, expected: int, errors: str, results: Callable[[Any, str, int], list]):
        self.client = client
        self.id = job_id_of({"id": job_id})
        self._path = f"/v1/jobs/{quote(self.id, safe='')}"
        self.expected = expected
        self.errors = errors
        self._results = results
        self._answer: Any = None

    @classmethod
    def from_answer(cls, client, answer: Any, expected: int, errors: str, results: Callable[[Any, str, int], list]) -> "RemoteJob":
        """The handle of a submit answer (its id checked: ``job_id_of``)."""
        return cls(client, job_id_of(answer), expected, errors, results)

    def _settle(self, answer: Any) -> bool:
        status = answer.get("status") if isinstance(answer, dict) else None
        if status not in ("pending", "failed", "done"):
            raise ServiceError(f"job {self.id}: the service's answer is not a job status (pending, done or failed): {str(answer)[:80]!r}")
        if status == "pending":
            return False
        if status == "failed":
            err = answer.get("error") if isinstance(answer.get("error"), dict) else {}
            raise ServiceError(f"job {self.id} failed: {err.get('message', 'no reason given')}", 200, err.get("code"))
        self._answer = answer
        return True

    def done(self) -> bool:
        """Whether the job has finished (one request; no waiting)."""
        return self._answer is not None or self._settle(self.client.http.request("GET", self._path, ok=(202,)))

    def result(self, timeout: float | None = None) -> list:
        """The job's results, one ``ScoreResult`` or ``RemoteItemError`` per item, waiting up to ``timeout`` seconds."""
        deadline, wait = (None if timeout is None else time.monotonic() + timeout), 0.05
        while not self.done():
            if deadline is not None and time.monotonic() + wait > deadline:
                raise ServiceError(f"job {self.id} was not done after {timeout:g} s")
            time.sleep(wait)
            wait = min(1.0, wait * 2)
        return self._results(self._answer, self.errors, self.expected)

    async def aresult(self, timeout: float | None = None) -> list:
        """``result``, awaited (polling with the client's async connection)."""
        deadline, wait = (None if timeout is None else time.monotonic() + timeout), 0.05
        while self._answer is None:
            if self._settle(await self.client.http.arequest("GET", self._path, ok=(202,))):
                break
            if deadline is not None and time.monotonic() + wait > deadline:
                raise ServiceError(f"job {self.id} was not done after {timeout:g} s")
            await asyncio.sleep(wait)
            wait = min(1.0, wait * 2)
        return self._results(self._answer, self.errors, self.expected)
