"""HTTP for the client: one retry policy for sync and async, answers bounded in size and time.

``Transport`` runs a request plan (``bodies.plan``) against ``nvrm serve`` through ``remote.exchange`` (the one
bounded, retried exchange nvrm's judges and refresh swap use too). Connection errors and 502/503/504 are retried
with exponential backoff and jitter (``Retry-After`` honoured, up to 30 s); every exchange as a whole is bounded by
``timeout`` and its answer by ``max_response_bytes`` (decoded); an error answer becomes a ``ServiceError`` with the
server's code. The httpx clients can be handed in (an app served in process: ``fastapi.testclient.TestClient``).
"""

from __future__ import annotations

import time
from typing import Any, Generator

import httpx

from ..errors import Retryable, ServiceError
from ..protocol import ErrorCode
from .exchange import Backoff, Received, TooSlow, aexchange, aretrying, exchange, retry_after, retrying

__all__ = ["Retryable", "Transport", "failure", "RETRY_STATUS"]  # Retryable lives in nvrm.errors; importable here as before

RETRY_STATUS = {502, 503, 504}


_DONE = object()


def _advance(plan: Generator, reply: Any) -> tuple:
    """The plan's next exchange after ``reply`` (an answer, or a ``ServiceError`` to throw into it), or
    ``(_DONE, value)`` when it has finished."""
    try:
        return plan.throw(reply) if isinstance(reply, ServiceError) else plan.send(reply)
    except StopIteration as stop:
        return (_DONE, stop.value)


def _whole(got: Received) -> httpx.Response:
    """A bounded answer, read and decoded, as an ordinary response."""
    headers = [(k, v) for k, v in got.headers.multi_items() if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(got.status, headers=headers, content=got.body.bytes(), request=got.request)


def failure(response: httpx.Response) -> ServiceError:
    """A ``ServiceError`` for an error answer (the server's JSON error body, else its text)."""
    try:
        err = response.json()["error"]
        return ServiceError(f"service answered {response.status_code}: {err['message']}", response.status_code, ErrorCode.read(err.get("code")))
    except Exception:  # noqa: BLE001 - not our JSON error body
        return ServiceError(f"service answered {response.status_code}: {response.text[:200]}", response.status_code)


class Transport:
    """Requests to one base URL, with retries, deadlines and size caps."""

    def __init__(self, url: str, *, headers: dict[str, str], timeout: float, retries: int, backoff: float, max_response_bytes: int,
                 http: httpx.Client | None = None, ahttp: httpx.AsyncClient | None = None):
        self.url = url
        self.headers = headers
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_response_bytes = max_response_bytes
        self._sync = http
        self._async = ahttp
        self._owned = (http is None, ahttp is None)

    def check(self, response: httpx.Response, ok: tuple[int, ...] = (422,)) -> Any:
        """The JSON of ``response``; retryable or final ``ServiceError`` otherwise (``ok``: error statuses
        whose body is a normal answer, such as 422 when every item failed on its input)."""
        if response.status_code in RETRY_STATUS:
            raise Retryable(failure(response), retry_after(response.headers))
        if response.status_code >= 400 and response.status_code not in ok:
            raise failure(response)
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type")
            raise ServiceError(f"service answered {response.status_code} with {kind}, not JSON: {response.text[:120]!r}", response.status_code) from None

    def _answer(self, got: Received) -> httpx.Response:
        """``got`` as a whole response, unless it passed the size cap or could not be decoded."""
        if got.body.too_large:
            raise ServiceError(f"{self.url}: the answer is larger than max_response_bytes={self.max_response_bytes}; not read further")
        if got.body.error:
            raise ServiceError(f"{self.url}: {got.body.error}", got.status)
        return _whole(got)

    def _late(self) -> Retryable:
        return Retryable(ServiceError(f"{self.url}: the answer took longer than timeout={self.timeout:g} s in all"), None)

    def _unreachable(self, e: httpx.TransportError) -> Retryable:
        return Retryable(ServiceError(f"cannot reach {self.url}: {type(e).__name__}: {e}"), None)

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (422,), **kwargs: Any) -> Any:
        """One exchange (retried), its JSON answer (``ok``: error statuses whose body is a normal answer)."""
        headers = {**self.headers, **kwargs.pop("headers", {})}
        if self._sync is None:
            self._sync = httpx.Client(timeout=self.timeout, headers=self.headers)
        try:
            for attempt in retrying(self.retries, Backoff(self.backoff)):
                with attempt:
                    try:
                        got = exchange(self._sync, method, self.url + path, limit=self.max_response_bytes,
                                       deadline=time.monotonic() + self.timeout, headers=headers, **kwargs)
                    except TooSlow:
                        raise self._late() from None
                    except httpx.TransportError as e:
                        raise self._unreachable(e) from e
                    return self.check(self._answer(got), ok)
        except Retryable as e:
            raise e.error from None

    async def arequest(self, method: str, path: str, *, ok: tuple[int, ...] = (422,), **kwargs: Any) -> Any:
        """``request``, asynchronously."""
        headers = {**self.headers, **kwargs.pop("headers", {})}
        if self._async is None:
            self._async = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)
        try:
            async for attempt in aretrying(self.retries, Backoff(self.backoff)):
                with attempt:
                    try:
                        got = await aexchange(self._async, method, self.url + path, limit=self.max_response_bytes,
                                              deadline=time.monotonic() + self.timeout, headers=headers, **kwargs)
                    except TooSlow:
                        raise self._late() from None
                    except httpx.TransportError as e:
                        raise self._unreachable(e) from e
                    return self.check(self._answer(got), ok)
        except Retryable as e:
            raise e.error from None

    def status(self, path: str) -> int | None:
        """One GET, not retried: its status code, or None when the server cannot be reached (or does not answer in time)."""
        if self._sync is None:
            self._sync = httpx.Client(timeout=self.timeout, headers=self.headers)
        try:
            return exchange(self._sync, "GET", self.url + path, limit=self.max_response_bytes, deadline=time.monotonic() + self.timeout,
                            headers=self.headers).status
        except (httpx.TransportError, TooSlow):
            return None

    def run(self, plan: Generator) -> Any:
        """A request plan run with the sync client; its final answer."""
        reply: Any = None
        while (step := _advance(plan, reply))[0] is not _DONE:
            try:
                reply = self.request(step[0], step[1], **step[2])
            except ServiceError as e:
                reply = e
        return step[1]

    async def arun(self, plan: Generator) -> Any:
        """A request plan run with the async client."""
        reply: Any = None
        while (step := _advance(plan, reply))[0] is not _DONE:
            try:
                reply = await self.arequest(step[0], step[1], **step[2])
            except ServiceError as e:
                reply = e
        return step[1]

    def close(self) -> None:
        if self._sync is not None and self._owned[0]:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        if self._async is not None and self._owned[1]:
            await self._async.aclose()
            self._async = None
