"""One bounded, retried HTTP exchange for everything nvrm asks over HTTP: the client (``remote.http.Transport``), the
chat judges (``prefs.judges.ChatJudge``) and the refresh swap (``refresh.swap``). A peer is not trusted to be well behaved.

- ``exchange`` / ``aexchange``: one request, its answer read raw and decoded here as it arrives (identity, gzip or
  deflate: ``ACCEPT_ENCODING`` is what is asked for) into a ``BoundedBody`` of at most ``limit`` decoded bytes, so a
  gzip bomb stops at the bound instead of inflating in memory and an identity body that declares more is not read
  at all; the whole exchange (connecting, sending and every byte of the answer) ends by ``deadline``
  (``time.monotonic``), else ``TooSlow``. Connection trouble is httpx's own ``TransportError``.
- ``Backoff``: how long to wait before another try: exponential with jitter, at most ``most_s``, a server's
  ``Retry-After`` honoured up to 30 s.
- ``retrying`` / ``aretrying``: the retry loop (tenacity's) over ``Retryable`` with that backoff.

Each caller keeps its own words for what went wrong (a ``ServiceError``, a judgment's reason, a ``RefreshError``)
and decides what is worth another try; how to ask, read, bound and wait is decided once, here.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import zlib
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import AsyncRetrying, Retrying, retry_if_exception_type, stop_after_attempt

from ..errors import Retryable

ACCEPT_ENCODING = "gzip, deflate"
"""The content encodings asked for: the ones ``BoundedBody`` decodes within its bound."""

RETRY_AFTER_MOST_S = 30.0
"""The longest ``Retry-After`` honoured."""


class TooSlow(TimeoutError):
    """The exchange did not end by its deadline (a server trickling bytes, or never answering)."""


class BoundedBody:
    """An answer's body decoded as it arrives, holding at most ``limit`` decoded bytes."""

    def __init__(self, encoding: str, limit: int):
        enc = (encoding or "").strip().lower()
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []
        self.too_large = False
        self.error: str | None = None
        self._z = None
        if enc in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(31)
        elif enc == "deflate":
            self._z = zlib.decompressobj(15)
        elif enc not in ("", "identity"):
            self.error = f"the answer's content-encoding {enc[:40]!r} is not gzip, deflate or identity"

    @property
    def identity(self) -> bool:
        """The body is not encoded: its declared length is its decoded size."""
        return self._z is None and self.error is None

    @property
    def done(self) -> bool:
        """Nothing more is wanted: the bound is reached or the body cannot be decoded."""
        return self.too_large or self.error is not None

    def feed(self, data: bytes) -> None:
        """Add raw bytes as received; stops (``done``) once more than ``limit`` decoded bytes came."""
        if self.done:
            return
        if self._z is None:
            self._keep(data)
            return
        try:
            while data and not self.done:
                self._keep(self._z.decompress(data, self.limit - self.size + 1))  # never more than the bound, whatever the ratio
                data = self._z.unconsumed_tail
        except zlib.error as e:
            self.error = f"the answer's compressed body is damaged ({e})"

    def _keep(self, out: bytes) -> None:
        room = self.limit - self.size
        if len(out) > room:
            out, self.too_large = out[:room], True
        self.parts.append(out)
        self.size += len(out)

    def bytes(self) -> bytes:
        """The decoded body (up to the bound)."""
        return b"".join(self.parts)

    def text(self) -> str:
        """The decoded body (up to the bound) as text."""
        return self.bytes().decode("utf-8", errors="replace")


@dataclass
class Received:
    """One answer: its status and headers, and its body as far as it was read."""

    status: int
    headers: httpx.Headers
    body: BoundedBody
    request: httpx.Request
    declared: int | None = None
    """The ``Content-Length`` the server declared, if any."""
    unread: bool = False
    """An identity body declared larger than the bound: refused before a byte of it was read (``body.too_large``)."""


def _opened(r: httpx.Response, limit: int) -> Received:
    length = r.headers.get("content-length", "")
    declared = int(length) if length.isdigit() else None
    # a response built whole (``httpx.MockTransport``, ``Response(json=...)``) was read and decoded by httpx already
    encoding = "" if r.is_stream_consumed else r.headers.get("content-encoding", "")
    got = Received(r.status_code, r.headers, BoundedBody(encoding, limit), r.request, declared)
    if declared is not None and declared > limit and got.body.identity:
        got.body.too_large = got.unread = True
    return got


def _late(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TooSlow("the answer did not end by its deadline")


def _headers(kw: dict[str, Any]) -> dict[str, Any]:
    return {**kw, "headers": {"Accept-Encoding": ACCEPT_ENCODING, **(kw.get("headers") or {})}}


def exchange(http: httpx.Client, method: str, url: str, *, limit: int, deadline: float, **kw: Any) -> Received:
    """One request with ``http`` (``kw`` as for ``httpx.Client.stream``) and its answer, read no further than ``limit``
    decoded bytes and no later than ``deadline`` (``TooSlow``; a read blocked past it ends at the client's timeout)."""
    with http.stream(method, url, **_headers(kw)) as r:
        got = _opened(r, limit)
        if not got.body.done:
            for data in [r.content] if r.is_stream_consumed else r.iter_raw():
                got.body.feed(data)
                if got.body.done:
                    break
                _late(deadline)
    return got


async def aexchange(http: httpx.AsyncClient, method: str, url: str, *, limit: int, deadline: float, **kw: Any) -> Received:
    """``exchange``, awaited: the whole of it is cancelled at ``deadline`` (``TooSlow``), connecting included."""

    async def run() -> Received:
        async with http.stream(method, url, **_headers(kw)) as r:
            got = _opened(r, limit)
            if got.body.done:
                return got
            if r.is_stream_consumed:
                got.body.feed(r.content)
                return got
            async for data in r.aiter_raw():
                got.body.feed(data)
                if got.body.done:
                    break
                _late(deadline)
            return got

    try:
        return await asyncio.wait_for(run(), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise TooSlow("the answer did not end by its deadline") from None


def retry_after(headers: httpx.Headers | None) -> float | None:
    """A ``Retry-After`` of seconds (``"2"``, ``"0.5"``), or None (absent, a date, not a number)."""
    value = headers.get("retry-after", "") if headers is not None else ""
    return float(value) if value.replace(".", "", 1).isdigit() else None


@dataclass(frozen=True)
class Backoff:
    """The wait before try ``n + 1``: ``first_s * 2 ** (n - 1)``, at most ``most_s``, times a jitter of 0.5 to 1.5; a
    server's ``Retry-After`` instead when it gave one (at most ``RETRY_AFTER_MOST_S``)."""

    first_s: float = 0.5
    most_s: float = math.inf

    def wait(self, attempt: int, after: float | None = None) -> float:
        """Seconds to wait after failed try number ``attempt`` (from 1)."""
        if after is not None:
            return min(after, RETRY_AFTER_MOST_S)
        return min(self.most_s, self.first_s * 2 ** (attempt - 1)) * (0.5 + random.random())


def _policy(retries: int, backoff: Backoff) -> dict[str, Any]:
    def wait(state) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return backoff.wait(state.attempt_number, error.retry_after if isinstance(error, Retryable) else None)

    return {"stop": stop_after_attempt(retries + 1), "wait": wait, "retry": retry_if_exception_type(Retryable), "reraise": True}


def retrying(retries: int, backoff: Backoff) -> Retrying:
    """Up to ``retries`` more tries of a block that raises ``Retryable`` (the last one re-raised), waiting ``backoff``."""
    return Retrying(**_policy(retries, backoff))


def aretrying(retries: int, backoff: Backoff) -> AsyncRetrying:
    """``retrying`` for ``async for``."""
    return AsyncRetrying(**_policy(retries, backoff))
