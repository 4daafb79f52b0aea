"""The service's logic, without HTTP: ``Serving`` answers each request as a ``Reply`` (status, body, headers).

Routes (``routes.py``) only turn an HTTP request into a call here and the ``Reply`` back into a
response, so everything below is testable by calling it (``handle(work)``), and the app in process.

    request ─► reserve the body's bytes ─► read it ─► decode (a thread: ``requests.parse_work``)
            ─► reserve its prepared frames' bytes ─► handle: admit, submit to the scheduler, await
            ─► Reply (200; 422 when every item failed on its input; 503 / 413 / 504 with a reason)

State shared by the routes lives here too: settings, metrics, the caches and the byte budget, and
(once loaded) the model and its scheduler.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ..errors import BackendUnavailable, InputError, RequestError, ShuttingDown
from ..protocol import INPUT_CODES, ErrorCode, error_body
from ..results import item_dict
from .admission.budget import ByteBudget
from .config import ServeConfig
from .batching.contexts import ContextCache, ContextStore, PrefixCache
from .admission.memory import Trimmer
from .metrics import Metrics
from .admission.requests import Work, parse_upload, parse_work
from .batching.scheduler import Scheduler
from ..record import capture as record_capture

@dataclass(frozen=True)
class Reply:
    """One answer: HTTP status, a JSON body and extra headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def error(cls, code: ErrorCode | str, message: str, headers: dict[str, str] | None = None, *, status: int | None = None) -> "Reply":
        """An error answer: ``code``'s HTTP status (or ``status``) and the JSON error body."""
        code = ErrorCode(code)
        return cls(code.status if status is None else status, error_body(code, message), headers or {})


@dataclass(frozen=True)
class Body:
    """A request body not read yet: its content type, declared length and how to read it."""

    content_type: str
    content_length: str | None
    read: Callable[[], Awaitable[bytes]]


class Serving:
    """The reward service's handlers over one model (installed once it is loaded)."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.model = None
        self.scheduler: Scheduler | None = None
        self.load_error: str | None = None
        self.replica = f"{socket.gethostname()}:{os.getpid()}"
        # freed memory goes back to the system once nothing is in flight (nvrm.serve.admission.memory)
        self.trimmer = Trimmer(lambda: self.budget.used == 0)
        self.budget = ByteBudget(int(config.max_inflight_mb * 1024 * 1024), on_release=self.trimmer.touch)
        self.metrics = Metrics(
            lambda: self.scheduler.depth if self.scheduler else 0,
            lambda: self.cache.bytes,
            lambda: self.prefixes.bytes,
            lambda: self.store.bytes,
            lambda: self.budget.used,
        )
        self.cache = ContextCache(int(config.context_cache_mb * 1024 * 1024), self._counter(self.metrics.context_cache))
        self.prefixes = PrefixCache(int(config.prefix_cache_mb * 1024 * 1024), self._counter(self.metrics.prefix_cache))
        self.store = ContextStore(int(config.context_store_mb * 1024 * 1024), self._counter(self.metrics.context_store))
        self.recorder = record_capture.from_serve(config)  # --record DIR: scored items kept off the request path (nvrm.record)

    @staticmethod
    def _counter(metric) -> Callable[[bool], None]:
        return lambda hit: metric.labels(result="hit" if hit else "miss").inc()

    def install(self, model) -> None:
        """Serve ``model`` from now on (its scheduler starts)."""
        c = self.config
        self.scheduler = Scheduler(model, max_batch_items=c.max_batch_items, max_wait_ms=c.max_wait_ms, share_wait_ms=c.share_wait_ms,
                                   max_queue_items=c.max_queue_items, metrics=self.metrics, cache=self.cache, prefixes=self.prefixes)
        self.model = model

    def drain(self, seconds: float, *, wait: bool = True) -> bool:
        """The service's one drain: refuse new work at once, answer what is still open "shutting down" after
        ``seconds``, and (``wait``) wait as long for the scorer to stop. Idempotent: the first call starts it
        (a signal, or the app's shutdown), later ones only wait. True once the scorer has stopped (or never ran);
        False without ``wait``, or while a forward pass is still running after ``seconds``."""
        if self.scheduler is None:
            return True
        self.scheduler.begin_drain(seconds)
        return self.scheduler.stop(seconds) if wait else False

    # ------------------------------------------------------------ probes and info

    def not_ready(self) -> Reply | None:
        if self.model is None:
            return Reply.error(ErrorCode.NOT_READY, self.load_error or "model is loading", {"Retry-After": "2"})
        return None

    def ready(self) -> Reply:
        if self.scheduler is not None and self.scheduler.draining:
            return Reply.error(ErrorCode.SHUTTING_DOWN, "the server is shutting down", {"Retry-After": "1"})
        return self.not_ready() or Reply(200, {"status": "ready"})

    def info(self) -> Reply:
        if (busy := self.not_ready()) is not None:
            return busy
        m = self.model
        c = m.contract
        sampling = {  # what a client needs to sample frames itself before uploading (nvrm.video.sampling)
            "sample_fps": c.sample_fps,
            "candidate_seconds": c.candidate_seconds,
            "candidate_frames": c.candidate_frames,
            "max_context_frames": c.max_context_frames,
            "short_candidates": c.short_candidates,
            "no_context": c.no_context,
        }
        return Reply(200, {
            "model": m.info(),
            "contract": {"fingerprint": m.fingerprint, "contract_fields_fingerprint": c.fingerprint, "fields": c.to_dict(), "sampling": sampling},
            "limits": {**self.config.public(), **dataclasses.asdict(m.limits)},
            "guard": m.guard.summary() if getattr(m, "guard", None) is not None else None,
            "replica": self.replica,
        })

    def has_context(self, ref: str) -> Reply:
        if (busy := self.not_ready()) is not None:
            return busy
        if self.store.get(ref) is None:
            return Reply.error(ErrorCode.CONTEXT_UNKNOWN,
                               f"context {ref[:16]} is not held by this server; upload it with POST /v1/contexts")
        return Reply(200, {"ref": ref})

    # ------------------------------------------------------------ admission in bytes

    def refused(self, e: InputError) -> Reply:
        """A request refused before any work: its status and code (400 ``bad_request`` for a plain input error), counted."""
        code = e.code if isinstance(e, RequestError) else ErrorCode.BAD_REQUEST
        self.metrics.rejected.labels(reason=code).inc()
        return Reply.error(code, str(e), status=e.status if isinstance(e, RequestError) else None)

    def overloaded(self, what: str) -> Reply:
        self.metrics.rejected.labels(reason="memory").inc()
        return Reply.error(ErrorCode.OVERLOADED, f"{what}: the bytes in flight are at --max-inflight-mb ({self.budget.used} of {self.budget.max_bytes} "
                           "reserved); retry shortly", {"Retry-After": "1"})

    def body_reservation(self, body: Body) -> int:
        """Bytes a body reserves before it is read: its declared length, else the body limit."""
        length = body.content_length or ""
        return min(int(length), self.config.max_body_bytes) if length.isdigit() else self.config.max_body_bytes

    async def with_body(self, body: Body, what: str, then: Callable[[bytes, int], Awaitable[Reply]]) -> Reply:
        """``then(raw, reserved)`` with the body read under its reservation (503 when it does not fit)."""
        if (busy := self.not_ready()) is not None:
            return busy
        reserved = self.body_reservation(body)
        if not self.budget.try_reserve(reserved):
            return self.overloaded(what)
        try:
            raw = await body.read()
            return await then(raw, reserved)
        except InputError as e:
            return self.refused(e)
        finally:
            self.budget.release(reserved)

    async def upload(self, body: Body) -> Reply:
        """``POST /v1/contexts``: keep one context, answer its ref."""

        async def keep(raw: bytes, _: int) -> Reply:
            self.metrics.upload_bytes.labels(endpoint="contexts").inc(len(raw))
            answer = await asyncio.to_thread(parse_upload, self, raw, body.content_type)
            self.metrics.context_kept.inc()
            return Reply(200, answer)

        return await self.with_body(body, "context upload", keep)

    async def score(self, kind: str, body: Body) -> Reply:
        """``POST /v1/score`` (``kind="score"``) or ``/v1/score_group`` (``"group"``)."""
        t = time.perf_counter()

        async def parsed(raw: bytes, reserved: int) -> Reply:
            self.metrics.upload_bytes.labels(endpoint=kind).inc(len(raw))
            work = await asyncio.to_thread(parse_work, self, raw, body.content_type, kind)
            self.metrics.parse.observe(work.cpu_seconds)
            self.metrics.context_hash.observe(work.hash_seconds)
            self.metrics.receive.observe(time.perf_counter() - t - work.cpu_seconds - work.hash_seconds)
            return await self.admit(work, reserved)

        return await self.with_body(body, "request body", parsed)

    async def admit(self, work: Work, body_bytes: int = 0) -> Reply:
        """``handle(work)`` under a reservation of its prepared frames (413 if it could never fit, 503 if not now)."""
        need = work.prepared_bytes
        if need + body_bytes > self.budget.max_bytes:
            self.metrics.rejected.labels(reason="memory").inc()
            return Reply.error(ErrorCode.TOO_LARGE, f"request: its prepared frames need up to {need} bytes, more than --max-inflight-mb allows "
                               f"({self.budget.max_bytes}); send fewer items or shorter contexts")
        if not self.budget.try_reserve(need):
            return self.overloaded("request")
        try:
            return await self.handle(work)
        finally:
            self.budget.release(need)

    # ------------------------------------------------------------ the work itself

    async def handle(self, work: Work) -> Reply:
        """Score a decoded request: admitted to the scheduler, every item answered in its slot."""
        if (busy := self.not_ready()) is not None:
            return busy
        results = await self.results(work)
        if isinstance(results, Reply):
            return results
        m = self.model
        body = {
            "results": [item_dict(r) for r in results],
            "model": {"revision": m.revision, "path": str(m.path) if m.path else None},
            "contract": m.fingerprint,
            "replica": self.replica,
        }
        # a well-formed request: per-item errors ride in a 200, unless every item failed on its input
        failed_on_input = body["results"] and all(r.get("error", {}).get("code") in INPUT_CODES for r in body["results"])
        return Reply(422 if failed_on_input else 200, body)

    async def results(self, work: Work, scheduler: Scheduler | None = None) -> "list[Any] | Reply":
        """One ``ScoreResult`` or error per item of ``work`` (on ``scheduler``, default the model's), or the ``Reply`` that refused it."""
        scheduler, timeout = scheduler or self.scheduler, self.config.request_timeout_s
        if not scheduler.try_admit(work.size):  # type: ignore[union-attr]
            self.metrics.rejected.labels(reason="queue_full").inc()
            return Reply.error(ErrorCode.OVERLOADED, f"queue is full ({scheduler.depth} items in flight); retry shortly",  # type: ignore[union-attr]
                               {"Retry-After": "1"})
        deadline = time.monotonic() + timeout
        if work.kind == "score":
            futures = [scheduler.submit(p, c, d, deadline=deadline, exact=work.exact) for p, c, d in work.items]  # type: ignore[union-attr]
        else:
            futures = [scheduler.submit_group(*work.group, deadline=deadline, exact=work.exact)]  # type: ignore[union-attr,misc]
        try:
            done = await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(f) for f in futures)), timeout)
        except asyncio.TimeoutError:
            for f in futures:
                f.cancel()
            # the reservation goes back with this answer, but a worker may still be preparing the request's
            # frames from its body: they stay counted until the scheduler lets go of them
            self.budget.hold_until_done(work.body_bytes + work.prepared_bytes, [f.settled for f in futures])
            self.metrics.rejected.labels(reason=ErrorCode.TIMEOUT).inc()
            return Reply.error(ErrorCode.TIMEOUT, f"scoring took longer than {timeout:g} s")
        results = list(done) if work.kind == "score" else list(done[0])
        for r in results:  # the whole request was refused while it waited (shutdown)
            if isinstance(r, ShuttingDown):
                return Reply.error(r.code, str(r), {"Retry-After": "1"}, status=r.status)
        if results and all(isinstance(r, BackendUnavailable) for r in results):  # the backend (vLLM) is down: nothing was scored
            return Reply.error(results[0].code, str(results[0]), {"Retry-After": "5"}, status=results[0].status)
        record_capture.offer_work(self.recorder, work, results, scheduler.model)  # type: ignore[union-attr]
        return results
