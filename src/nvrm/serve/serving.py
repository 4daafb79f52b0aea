"""The service's logic, without HTTP: ``Serving`` admits requests in bytes and scores decoded work on the served
models, answering typed results (``Scored``) or a ``Reply`` that refused them.

Protocols (``protocols/``) only decode their wire into ``Work`` and encode ``Scored`` back into it; the routes only
turn an HTTP request into a call there. So everything below is testable by calling it, and the app in process.

    body ─► reserve its bytes ─► read it ─► decode (a thread, over ``parse_context()``)
         ─► reserve its prepared frames' bytes (``admit``) ─► ``score``: lease the revision its model names,
            check ``expect_revision``, submit to that revision's scheduler, await
         ─► ``Scored`` (one result or error per item, and the revision that scored them), or a refusal
            (503 / 413 / 504 / 409 with a reason)

``score`` is the one place a revision is leased (``Registry.acquire`` / ``release``): ``/v1``, UniRL, verl-omni and
every job kind go through it. State shared by the routes lives here too: settings, metrics, the uploaded contexts,
the byte budget, and the served models (``models.served.ServedModels``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ..errors import BackendUnavailable, InputError, RequestError, ShuttingDown
from ..protocol import ErrorCode
from ..record import capture as record_capture
from .admission.budget import ByteBudget
from .admission.memory import Trimmer
from .admission.requests import ParseContext, Work
from .batching.contexts import UploadedContexts
from .config import ServeConfig
from .http.messages import PendingBody, Reply
from .metrics import Metrics
from .models.registry import ModelEntry
from .models.probing import Prober
from .models.served import ServedModels

RETRY_S = 0.05
"""How often patient work (a job: accepted, so never dropped) asks again for room in a full queue, or for a model
``--swap-mode replace`` is loading."""


@dataclass(frozen=True)
class Scored:
    """Work's results, one per item in order (a ``ScoreResult``, or the ``NvrmError`` that item failed with), and the
    revision that scored them (its name, digest, path and contract stay readable after it is freed)."""

    results: list[Any]
    entry: ModelEntry


class Serving:
    """The reward service's logic over the served models (installed once they are loaded)."""

    def __init__(self, config: ServeConfig, names: list[str] | None = None, rest: Callable[[], list[tuple[str, Any]]] | None = None):
        self.config = config
        self.replica = f"{socket.gethostname()}:{os.getpid()}"
        # freed memory goes back to the system once nothing is in flight (nvrm.serve.admission.memory)
        self.trimmer = Trimmer(lambda: self.budget.used == 0)
        self.budget = ByteBudget(int(config.max_inflight_mb * 1024 * 1024), on_release=self.trimmer.touch)
        self.metrics = Metrics(
            lambda: self.models.scheduler.depth if self.models.scheduler else 0,
            lambda: self.models.cache.bytes,
            lambda: self.models.prefixes.bytes,
            lambda: self.uploads.bytes,
            lambda: self.budget.used,
        )
        self.uploads = UploadedContexts(int(config.context_store_mb * 1024 * 1024), Metrics.lookups(self.metrics.context_store))
        """Contexts uploaded once (``POST /v1/contexts``) or first sent inline, named by content hash (``--context-store-mb``)."""
        self.models = ServedModels(config, self.metrics, names, rest)
        self.prober = Prober(config.probe_rate)
        """``--probe-rate``: a sampled share of scored items probed off the request path, for each model's monitor."""
        self.metrics.follow_monitors(lambda: {e.name: e.monitor.snapshot() for e in self.models.registry.entries.copy().values()})
        self.recorder = record_capture.from_serve(config)  # --record DIR: scored items kept off the request path (nvrm.record)

    # ------------------------------------------------------------ the served models

    @property
    def model(self):
        """The default model (None while it loads or is replaced)."""
        return self.models.model

    @property
    def scheduler(self):
        """The default model's scheduler (None while it loads or is replaced)."""
        return self.models.scheduler

    @property
    def registry(self):
        """The registry of served models (``models.registry.Registry``)."""
        return self.models.registry

    @property
    def names(self) -> list[str]:
        """The served models' names, the default first."""
        return self.models.names

    @property
    def free_memory(self) -> Callable[[Any], int]:
        """Bytes free for a new model on a device (the swap's memory check; a test injects a figure)."""
        return self.models.free_memory

    @free_memory.setter
    def free_memory(self, measure: Callable[[Any], int]) -> None:
        self.models.free_memory = measure

    def install(self, model) -> None:
        """Serve ``model`` from now on (and the other named models; their schedulers start)."""
        self.models.install(model)

    def drain(self, seconds: float, *, wait: bool = True) -> bool:
        """The service's one drain (``ServedModels.drain``)."""
        return self.models.drain(seconds, wait=wait)

    # ------------------------------------------------------------ probes and info

    def not_ready(self) -> Reply | None:
        """503 while the default model is not served (loading, failed, or replaced); None once it is."""
        return self.models.not_ready()


    # ------------------------------------------------------------ admission in bytes

    def refused(self, e: InputError) -> Reply:
        """A request refused before any work: its status and code (400 ``bad_request`` for a plain input error), counted."""
        return self.models.refused(e)

    def overloaded(self, what: str) -> Reply:
        """503: ``what`` does not fit in the bytes in flight now."""
        self.metrics.rejected.labels(reason="memory").inc()
        return Reply.error(ErrorCode.OVERLOADED, f"{what}: the bytes in flight are at --max-inflight-mb ({self.budget.used} of {self.budget.max_bytes} "
                           "reserved); retry shortly", {"Retry-After": "1"})

    def too_large(self, what: str, need: int) -> Reply | None:
        """413 when ``need`` bytes could never fit in ``--max-inflight-mb``; None when they could."""
        if need <= self.budget.max_bytes:
            return None
        self.metrics.rejected.labels(reason="memory").inc()
        return Reply.error(ErrorCode.TOO_LARGE, f"{what}: it needs up to {need} bytes, more than --max-inflight-mb allows ({self.budget.max_bytes})")

    def body_reservation(self, body: PendingBody) -> int:
        """Bytes a body reserves before it is read: its declared length, else the body limit."""
        length = body.content_length or ""
        return min(int(length), self.config.max_body_bytes) if length.isdigit() else self.config.max_body_bytes

    async def with_body(self, body: PendingBody, what: str, then: Callable[[bytes, int], Awaitable[Reply]]) -> Reply:
        """``then(raw, reserved)`` with the body read under its reservation (503 when it does not fit); an ``InputError``
        raised on the way is the request's refusal."""
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

    def parse_context(self, *, own_contexts: bool = True) -> ParseContext:
        """What decoding a request reads of the service now: the settings, the uploaded contexts and the served models.
        ``own_contexts=False``: with a store of 0 bytes, so a context named by ref is refused (409 ``context_unknown``;
        nvrm's client then sends it inline) and none is kept: a job whichever replica takes may not hold it."""
        targets, names, replacing = self.registry.parse_targets()
        uploads = self.uploads if own_contexts else UploadedContexts(0, lambda hit: None)
        return ParseContext(self.config, uploads, targets, names, replacing, kept=self.metrics.context_kept.inc)

    # ------------------------------------------------------------ scoring

    async def admit(self, work: Work, body_bytes: int = 0) -> "Scored | Reply":
        """``score(work)`` under a reservation of its prepared frames (413 if it could never fit, 503 if not now)."""
        need = work.prepared_bytes
        if need + body_bytes > self.budget.max_bytes:
            self.metrics.rejected.labels(reason="memory").inc()
            return Reply.error(ErrorCode.TOO_LARGE, f"request: its prepared frames need up to {need} bytes, more than --max-inflight-mb allows "
                               f"({self.budget.max_bytes}); send fewer items or shorter contexts")
        if not self.budget.try_reserve(need):
            return self.overloaded("request")
        try:
            return await self.score(work)
        finally:
            self.budget.release(need)

    async def score(self, work: Work, *, patient: bool = False) -> "Scored | Reply":
        """``work`` scored on the revision serving the model it names now, which stays leased (in flight) until it is
        answered: one result per item, or the refusal of the whole (409 on an ``expect_revision`` mismatch, 503 busy or
        swapped to another contract meanwhile, 504 past ``--request-timeout-s``). ``patient`` (an accepted job): waits
        while the scheduler's queue is full or ``--swap-mode replace`` loads the model, instead of refusing."""
        if not patient and (busy := self.not_ready()) is not None:
            return busy
        try:
            entry = await self._acquire(work.model, patient)
        except RequestError as e:
            return self.refused(e)
        try:
            if work.expect_revision is not None and work.expect_revision != entry.digest:
                return Reply.error(ErrorCode.REVISION_MISMATCH,
                                   f"expect_revision is {work.expect_revision}, but model {entry.name!r} is at revision {entry.digest}")
            if work.fingerprint is not None and work.fingerprint != entry.fingerprint:
                return Reply.error(ErrorCode.UNAVAILABLE,
                                   f"model {entry.name!r} was swapped to another contract while this request was read; retry",
                                   {"Retry-After": "1"})
            results = await self._results(work, entry.scheduler, patient)
            if isinstance(results, Reply):
                return results
            self.prober.offer(entry, work.items if work.items is not None else [(work.group[0], work.group[1], d) for d in work.group[2]],  # type: ignore[index]
                              results)
            return Scored(results, entry)
        finally:
            self.registry.release(entry)

    async def _acquire(self, name: str | None, patient: bool) -> ModelEntry:
        while True:
            try:
                return self.registry.acquire(name)
            except RequestError as e:  # 503 while --swap-mode replace loads its new revision: patient work waits
                if not (patient and e.status == 503):
                    raise
            await asyncio.sleep(RETRY_S)

    async def _results(self, work: Work, scheduler, patient: bool) -> "list[Any] | Reply":
        """One ``ScoreResult`` or error per item of ``work`` on ``scheduler``, or the ``Reply`` that refused it."""
        timeout = self.config.request_timeout_s
        if work.size == 0:
            return []
        while not scheduler.try_admit(work.size):
            if not patient:
                self.metrics.rejected.labels(reason="queue_full").inc()
                return Reply.error(ErrorCode.OVERLOADED, f"queue is full ({scheduler.depth} items in flight); retry shortly", {"Retry-After": "1"})
            await asyncio.sleep(RETRY_S)
        deadline = time.monotonic() + timeout
        if work.kind == "score":
            futures = [scheduler.submit(p, c, d, deadline=deadline, exact=work.exact) for p, c, d in work.items]  # type: ignore[union-attr]
        else:
            futures = [scheduler.submit_group(*work.group, deadline=deadline, exact=work.exact)]  # type: ignore[misc]
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
        record_capture.offer_work(self.recorder, work, results, scheduler.model)
        return results
