"""The service's endpoints. Handlers only read the body, hand parsing to a thread, admit work
and await it: nothing heavier than that runs on the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from ..errors import InputError, RequestError, ShuttingDown
from ..protocol import ContextUpload, ErrorResponse, GroupRequest, ScoreRequest, ScoreResponse, describe_validation_error
from ..results import item_dict
from .budget import prepared_bytes
from .media import HASH_SECONDS, Media, ref_of, stored, to_media
from .metrics import CONTENT_TYPE_LATEST
from .middleware import json_error
from .transport import parse_body, read_body

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 409, 413, 415, 503, 504)}


def _request_body_doc(model: type) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": ref},
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["request"],
                        "properties": {"request": ref},
                        "additionalProperties": {"type": "string", "format": "binary"},
                    },
                    "encoding": {"request": {"contentType": "application/json"}},
                },
            },
        }
    }


class Work:
    """A parsed request: what to submit and how many items it admits."""

    def __init__(self, kind: str, exact: bool, items: list[tuple[str, Any, Any]] | None = None, group: tuple[str, Any, list[Any]] | None = None):
        self.kind, self.exact, self.items, self.group = kind, exact, items, group
        self.cpu_seconds = 0.0
        """CPU time parsing and decoding took (the parse thread's own time, not waiting)."""
        self.hash_seconds = 0.0
        """CPU time hashing the contexts for the shared-context cache."""
        self.prepared_bytes = 0
        """An upper bound of the memory its prepared videos take (``nvrm.serve.budget``)."""

    @property
    def size(self) -> int:
        return len(self.items) if self.items is not None else len(self.group[2])  # type: ignore[index]


def parse_work(state, raw: bytes, content_type: str, kind: str) -> Work:
    """Body -> validated request -> media (decoded, confined, keyed). Runs in a worker thread."""
    cpu0 = time.thread_time()
    HASH_SECONDS.value = 0.0
    limits = state.model.limits
    max_items = min(limits.max_request_items, state.config.max_queue_items)
    body = parse_body(raw, content_type, max_items, 2 * limits.max_context_samples)
    model = ScoreRequest if kind == "score" else GroupRequest
    listed = body.payload.get("items" if kind == "score" else "candidates") if isinstance(body.payload, dict) else None
    n = len(listed) if isinstance(listed, list) else 0  # counted before validation builds an error per element
    if n <= max_items:
        try:
            req = model.model_validate(body.payload)
        except ValidationError as e:
            raise RequestError(*describe_validation_error(e)) from e
    if n > max_items:
        which = "max_request_items" if limits.max_request_items <= state.config.max_queue_items else "max_queue_items"
        raise RequestError("request", f"has {n} items; the limit is {max_items} per request ({which})", 413, "too_large")

    def media(video, where: str, role: str = "candidate"):
        # only contexts are shared across requests, so only they are hashed
        keyed = role == "context" and state.cache.enabled
        return to_media(video, state.config.allow_dirs, where, body.parts, limits, keyed=keyed, role=role, contract=state.model.contract, store=state.store)

    def context(video, where: str):
        if video is None:  # no context: the model's contract refuses it unless it has the no_context opt-in
            return Media(None, "none")
        m = media(video, where, "context")
        # an inline sampled clip or video bytes is kept under its content hash: later requests (from any
        # client) name it by ref, and share its prepared frames and prefill with this one
        inline = video.times is not None or video.data is not None or (video.part is not None and video.fps is None)
        if inline and state.store.max_bytes > 0:
            ref = ref_of(m, state.model.contract.fingerprint)
            held = state.store.peek(ref)
            if held is None:  # keep a copy that owns its memory (not a view of this request's body)
                held, size = stored(m, ref)
                if state.store.put(ref, held, size):
                    state.metrics.context_kept.inc()
            m = held
        return m

    if kind == "score":
        items = [
            (it.prompt, context(it.context, f"items[{i}].context"), media(it.candidate, f"items[{i}].candidate"))
            for i, it in enumerate(req.items)  # type: ignore[union-attr]
        ]
        work = Work(kind, req.exact, items=items)
    else:
        group = (req.prompt, context(req.context, "context"), [media(c, f"candidates[{i}]") for i, c in enumerate(req.candidates)])  # type: ignore[union-attr]
        work = Work(kind, req.exact, group=group)
    work.hash_seconds = HASH_SECONDS.value
    videos = [(c.value, "context", c.key) for _, c, _ in work.items] + [(d.value, "candidate", "") for _, _, d in work.items] if work.items is not None else (
        [(work.group[1].value, "context", work.group[1].key)] + [(d.value, "candidate", "") for d in work.group[2]]  # type: ignore[index]
    )
    work.prepared_bytes = prepared_bytes(videos, state.model.contract, limits, state.model.engine.codec is not None)
    work.cpu_seconds = time.thread_time() - cpu0 - work.hash_seconds
    return work


def parse_upload(state, raw: bytes, content_type: str) -> dict[str, Any]:
    """``POST /v1/contexts``: validate, sample-check and keep one context; answer its ref. Runs in a worker thread."""
    limits = state.model.limits
    body = parse_body(raw, content_type, 1)
    try:
        req = ContextUpload.model_validate(body.payload)
    except ValidationError as e:
        raise RequestError(*describe_validation_error(e)) from e
    if req.context.ref is not None or req.context.path is not None:
        raise InputError("context", "upload the content itself: sampled frames (with times and sampled) or encoded video bytes")
    if req.context.times is None and req.context.data is None and (req.context.part is None or req.context.fps is not None):
        raise InputError("context", "frames are uploaded sampled (with times and sampled); read /v1/info for the contract's time plan")
    media = to_media(req.context, (), "context", body.parts, limits, role="context", contract=state.model.contract)
    ref = ref_of(media, state.model.contract.fingerprint)
    kept, size = stored(media, ref)
    if state.store.max_bytes <= 0:
        raise RequestError("context", "context uploads are off on this server (--context-store-mb 0)", 403, "forbidden")
    if not state.store.put(ref, kept, size):
        raise RequestError("context", f"is {size} bytes, more than the whole context store ({state.store.max_bytes} bytes, --context-store-mb)", 413, "too_large")
    return {"ref": ref, "bytes": size}


def install(app: FastAPI, state) -> None:
    config, metrics = state.config, state.metrics

    def refused(e: InputError) -> JSONResponse:
        """A request refused before any work: its status and code (400 ``bad_request`` for a plain input error), counted."""
        status, code = (e.status, e.code) if isinstance(e, RequestError) else (400, "bad_request")
        metrics.rejected.labels(reason=code).inc()
        return json_error(status, code, str(e))

    def not_ready() -> JSONResponse | None:
        if state.model is None:
            return json_error(503, "not_ready", state.load_error or "model is loading", {"Retry-After": "2"})
        return None

    @app.get("/readyz", summary="Readiness: 200 once the model is loaded, 503 while loading or shutting down", responses={503: {"model": ErrorResponse}})
    async def readyz():
        if state.scheduler is not None and state.scheduler.draining:
            return json_error(503, "shutting_down", "the server is shutting down", {"Retry-After": "1"})
        return not_ready() or {"status": "ready"}

    @app.get("/healthz", summary="Liveness: answers as soon as the process runs")
    async def healthz():
        return {"status": "ok"}

    @app.get("/v1/info", summary="Model, contract and limits")
    async def info():
        if (busy := not_ready()) is not None:
            return busy
        m = state.model
        return {
            "model": m.info(),
            "contract": {
                "fingerprint": m.fingerprint,
                "contract_fields_fingerprint": m.contract.fingerprint,
                "fields": m.contract.to_dict(),
                # what a client needs to sample frames itself before uploading (nvrm.video.sampling)
                "sampling": {
                    "sample_fps": m.contract.sample_fps,
                    "candidate_seconds": m.contract.candidate_seconds,
                    "candidate_frames": m.contract.candidate_frames,
                    "max_context_frames": m.contract.max_context_frames,
                    "short_candidates": m.contract.short_candidates,
                    "no_context": m.contract.no_context,
                },
            },
            "limits": {**config.public(), **dataclasses.asdict(m.limits)},
            "replica": state.replica,
        }

    @app.post("/v1/contexts", summary="Keep a context on the server; later requests name it {\"ref\": hash}", responses=_ERRORS)
    async def upload_context(request: Request):
        if (busy := not_ready()) is not None:
            return busy
        reserved = body_reservation(request)
        if not state.budget.try_reserve(reserved):
            return overloaded("context upload")
        try:
            raw = await read_body(request, config.max_body_bytes, config.body_timeout_s)
            metrics.upload_bytes.labels(endpoint="contexts").inc(len(raw))
            answer = await asyncio.to_thread(parse_upload, state, raw, request.headers.get("content-type", ""))
        except InputError as e:
            return refused(e)
        finally:
            state.budget.release(reserved)
        metrics.context_kept.inc()
        return answer

    @app.get("/v1/contexts/{ref}", summary="Whether this server holds an uploaded context (404 if not)", responses={404: {"model": ErrorResponse}})
    async def has_context(ref: str):
        if (busy := not_ready()) is not None:
            return busy
        if state.store.get(ref) is None:
            return json_error(404, "context_unknown", f"context {ref[:16]} is not held by this server; upload it with POST /v1/contexts")
        return {"ref": ref}

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def overloaded(what: str) -> JSONResponse:
        metrics.rejected.labels(reason="memory").inc()
        return json_error(503, "overloaded", f"{what}: the bytes in flight are at --max-inflight-mb ({state.budget.used} of {state.budget.max_bytes} reserved); retry shortly", {"Retry-After": "1"})

    def body_reservation(request: Request) -> int:
        length = request.headers.get("content-length", "")
        return min(int(length), config.max_body_bytes) if length.isdigit() else config.max_body_bytes

    async def run(request: Request, kind: str) -> JSONResponse:
        if (busy := not_ready()) is not None:
            return busy
        reserved = body_reservation(request)
        if not state.budget.try_reserve(reserved):
            return overloaded("request body")
        try:
            return await run_reserved(request, kind, reserved)
        finally:
            state.budget.release(reserved)

    async def run_reserved(request: Request, kind: str, body_bytes: int) -> JSONResponse:
        t = time.perf_counter()
        try:
            raw = await read_body(request, config.max_body_bytes, config.body_timeout_s)
            metrics.upload_bytes.labels(endpoint=kind).inc(len(raw))
            work = await asyncio.to_thread(parse_work, state, raw, request.headers.get("content-type", ""), kind)
        except InputError as e:
            return refused(e)
        need = work.prepared_bytes
        if need + body_bytes > state.budget.max_bytes:
            metrics.rejected.labels(reason="memory").inc()
            return json_error(413, "too_large", f"request: its prepared frames need up to {need} bytes, more than --max-inflight-mb allows ({state.budget.max_bytes}); send fewer items or shorter contexts")
        if not state.budget.try_reserve(need):
            return overloaded("request")
        try:
            return await admitted(work, t)
        finally:
            state.budget.release(need)

    async def admitted(work: Work, t: float) -> JSONResponse:
        metrics.parse.observe(work.cpu_seconds)
        metrics.context_hash.observe(work.hash_seconds)
        metrics.receive.observe(time.perf_counter() - t - work.cpu_seconds - work.hash_seconds)
        scheduler = state.scheduler
        if not scheduler.try_admit(work.size):
            metrics.rejected.labels(reason="queue_full").inc()
            return json_error(503, "overloaded", f"queue is full ({scheduler.depth} items in flight); retry shortly", {"Retry-After": "1"})
        deadline = time.monotonic() + config.request_timeout_s
        if work.kind == "score":
            futures = [scheduler.submit(p, c, d, deadline=deadline, exact=work.exact) for p, c, d in work.items]  # type: ignore[union-attr]
        else:
            futures = [scheduler.submit_group(*work.group, deadline=deadline, exact=work.exact)]  # type: ignore[misc]
        try:
            done = await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(f) for f in futures)), config.request_timeout_s)
        except asyncio.TimeoutError:
            for f in futures:
                f.cancel()
            metrics.rejected.labels(reason="timeout").inc()
            return json_error(504, "timeout", f"scoring took longer than {config.request_timeout_s:g} s")
        results = list(done) if work.kind == "score" else list(done[0])
        for r in results:  # the whole request was refused while it waited (shutdown)
            if isinstance(r, ShuttingDown):
                return json_error(503, r.code, str(r), {"Retry-After": "1"})
        m = state.model
        body = {
            "results": [item_dict(r) for r in results],
            "model": {"revision": m.revision, "path": str(m.path) if m.path else None},
            "contract": m.fingerprint,
            "replica": state.replica,
        }
        # a well-formed request: per-item errors ride in a 200, unless every item failed on its input
        input_codes = ("invalid_input", "contract_violation", "limit_exceeded")
        status = 422 if body["results"] and all(r.get("error", {}).get("code") in input_codes for r in body["results"]) else 200
        return JSONResponse(body, status_code=status)

    routes = (
        ("/v1/score", "score", "Score independent items", ScoreRequest),
        ("/v1/score_group", "group", "Score candidates that share one prompt and context", GroupRequest),
    )
    for path, kind, summary, model in routes:

        async def endpoint(request: Request, kind: str = kind):
            return await run(request, kind)

        app.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            summary=summary,
            name=kind,
            response_model=ScoreResponse,
            responses={**_ERRORS, 422: {"model": ScoreResponse, "description": "every item failed on its input (same body)"}},
            openapi_extra=_request_body_doc(model),
        )
