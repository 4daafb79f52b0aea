"""A job submitted to ``nvrm serve`` (``POST /v1/jobs/...``): fetch its results later, blocking or awaited.

Polling backs off from 50 ms to 1 s (honouring the server's ``Retry-After``); a job the server no
longer holds (unknown, or expired after its ``--job-ttl-s``) is a ``ServiceError``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from ..errors import ServiceError


class RemoteJob:
    """A submitted request whose results are fetched from ``GET /v1/jobs/{id}``."""

    def __init__(self, client, job_id: str, expected: int, errors: str, results: Callable[[Any, str, int], list]):
        self.client = client
        self.id = job_id
        self.expected = expected
        self.errors = errors
        self._results = results
        self._answer: Any = None

    def _settle(self, answer: dict) -> bool:
        status = answer.get("status")
        if status == "pending":
            return False
        if status == "failed":
            err = answer.get("error") or {}
            raise ServiceError(f"job {self.id} failed: {err.get('message', 'no reason given')}", 200, err.get("code"))
        self._answer = answer
        return True

    def done(self) -> bool:
        """Whether the job has finished (one request; no waiting)."""
        return self._answer is not None or self._settle(self.client.http.request("GET", f"/v1/jobs/{self.id}", ok=(202,)))

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
            if self._settle(await self.client.http.arequest("GET", f"/v1/jobs/{self.id}", ok=(202,))):
                break
            if deadline is not None and time.monotonic() + wait > deadline:
                raise ServiceError(f"job {self.id} was not done after {timeout:g} s")
            await asyncio.sleep(wait)
            wait = min(1.0, wait * 2)
        return self._results(self._answer, self.errors, self.expected)
