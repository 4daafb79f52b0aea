"""nvrm's own protocol, ``/v1``: the probes, ``/v1/info``, uploaded contexts, ``/v1/score``, ``/v1/score_group``,
``/metrics``, and the job kind behind ``/v1/jobs`` (``V1Jobs``).

    decode   a ScoreRequest / GroupRequest body (JSON or multipart) -> ``Work`` (``admission.requests.parse_work``)
    encode   ``Scored`` -> the ``/v1`` answer (``v1_body``: every item's fields, tagged with the model and revision
             that scored it; 422 when every item failed on its input), the one builder every ``/v1`` path uses

A new request field is read where the request is validated (``protocol.ScoreRequest``, then ``parse_work``); a new
per-item answer field comes from ``results.item_dict`` through ``v1_body``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from ...protocol import INPUT_CODES, ErrorCode, ErrorResponse, GroupRequest, ScoreRequest, ScoreResponse, error_body
from ...results import item_dict
from ..admission.requests import ParseContext, Work, parse_upload, parse_work
from ..http.messages import PendingBody, Reply
from ..http.routing import ERRORS, pending_body, request_body_doc, respond
from ..jobs.job_service import JobService
from ..jobs.kinds import V1, JobKind
from ..jobs.storage import JobRecord
from ..metrics import CONTENT_TYPE_LATEST
from ..serving import Scored, Serving
from .spec import ProtocolSpec, Wire


def served_by(entry) -> dict[str, Any]:
    """The ``model`` object of an answer: the name, revision (weights digest) and folder of the model that scored it."""
    return {"name": entry.name, "revision": entry.digest, "path": str(entry.path) if entry.path else None}


def v1_body(scored: Scored, replica: str, conservative: float | None = None) -> dict[str, Any]:
    """The ``/v1`` answer's body: each item's reward fields or error (with ``conservative``, its ``conservative_reward``
    beside the raw one), tagged with the model and the revision (its weights digest) that scored it, that model, the
    contract fingerprint and the replica."""
    e = scored.entry
    body = {
        "results": [{**item_dict(r, conservative), "model": e.name, "model_revision": e.digest} for r in scored.results],
        "model": served_by(e),
        "contract": e.fingerprint,
        "replica": replica,
    }
    if conservative is not None:
        body["conservative"] = conservative
    return body


class NativeProtocol(ProtocolSpec[Work]):
    """``/v1``: decode a scoring request into ``Work``, encode ``Scored`` into the ``/v1`` answer; registers ``V1Jobs``."""

    name = "nvrm /v1"
    protected = ("/v1/", "/metrics")

    def __init__(self, serving: Serving, jobs: JobService):
        super().__init__(serving)
        jobs.register(V1Jobs(self))

    def decode(self, ctx: ParseContext, wire: Wire, kind: str = "score") -> Work:
        """A ``/v1/score`` (``kind="score"``) or ``/v1/score_group`` (``"group"``) body as ``Work``."""
        return parse_work(ctx, wire.raw, wire.content_type, kind)

    def encode(self, decoded: Work, outcome: Scored) -> Reply:
        """The ``/v1`` answer: 200, or 422 (same body) when every item failed on its input."""
        body = v1_body(outcome, self.serving.replica, decoded.conservative)
        failed_on_input = body["results"] and all(r.get("error", {}).get("code") in INPUT_CODES for r in body["results"])
        return Reply(422 if failed_on_input else 200, body)

    async def score(self, kind: str, body: PendingBody) -> Reply:
        """``POST /v1/score`` (``kind="score"``) or ``/v1/score_group`` (``"group"``), timed into the metrics."""
        serving, metrics, t = self.serving, self.serving.metrics, time.perf_counter()

        async def parsed(raw: bytes, reserved: int) -> Reply:
            metrics.upload_bytes.labels(endpoint=kind).inc(len(raw))
            work = await asyncio.to_thread(self.decode, serving.parse_context(), Wire(raw, body.content_type), kind)
            metrics.parse.observe(work.cpu_seconds)
            metrics.context_hash.observe(work.hash_seconds)
            metrics.receive.observe(time.perf_counter() - t - work.cpu_seconds - work.hash_seconds)
            outcome = await serving.admit(work, reserved)
            return outcome if isinstance(outcome, Reply) else self.encode(work, outcome)

        return await serving.with_body(body, "request body", parsed)

    async def upload(self, body: PendingBody) -> Reply:
        """``POST /v1/contexts``: keep one context, answer its ref."""
        serving = self.serving

        async def keep(raw: bytes, _: int) -> Reply:
            serving.metrics.upload_bytes.labels(endpoint="contexts").inc(len(raw))
            answer = await asyncio.to_thread(parse_upload, serving.parse_context(), raw, body.content_type)
            serving.metrics.context_kept.inc()
            return Reply(200, answer)

        return await serving.with_body(body, "context upload", keep)

    def ready(self) -> Reply:
        """``/readyz``: 200 once the model is served, 503 while loading or shutting down."""
        serving = self.serving
        if serving.scheduler is not None and serving.scheduler.draining:
            return Reply.error(ErrorCode.SHUTTING_DOWN, "the server is shutting down", {"Retry-After": "1"})
        return serving.not_ready() or Reply(200, {"status": "ready"})

    def info(self) -> Reply:
        """``/v1/info``: the default model, its contract and sampling, the limits, the guard and this replica."""
        serving = self.serving
        if (busy := serving.not_ready()) is not None:
            return busy
        m = serving.model
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
            "limits": {**serving.config.public(), **dataclasses.asdict(m.limits)},
            "guard": m.guard.summary() if getattr(m, "guard", None) is not None else None,
            "replica": serving.replica,
        })

    def has_context(self, ref: str) -> Reply:
        """``GET /v1/contexts/{ref}``: 200 while the uploaded contexts hold it, 404 otherwise."""
        serving = self.serving
        if (busy := serving.not_ready()) is not None:
            return busy
        if serving.uploads.get(ref) is None:
            return Reply.error(ErrorCode.CONTEXT_UNKNOWN,
                               f"context {ref[:16]} is not held by this server; upload it with POST /v1/contexts")
        return Reply(200, {"ref": ref})

    def attach_router(self, app: FastAPI) -> None:
        """The probes, ``/v1/info``, contexts, ``/v1/score``, ``/v1/score_group`` and ``/metrics``."""
        app.include_router(self.router())

    def router(self) -> APIRouter:
        """Its endpoints as one router."""
        router = APIRouter()
        serving = self.serving
        config, metrics = serving.config, serving.metrics

        @router.get("/readyz", summary="Readiness: 200 once the model is loaded, 503 while loading or shutting down",
                    responses={503: {"model": ErrorResponse}})
        async def readyz():
            return respond(self.ready())

        @router.get("/healthz", summary="Liveness: answers as soon as the process runs")
        async def healthz():
            return {"status": "ok"}

        @router.get("/v1/info", summary="Model, contract and limits")
        async def info():
            return respond(self.info())

        @router.post("/v1/contexts", summary="Keep a context on the server; later requests name it {\"ref\": hash}", responses=ERRORS)
        async def upload_context(request: Request):
            return respond(await self.upload(pending_body(request, config)))

        @router.get("/v1/contexts/{ref}", summary="Whether this server holds an uploaded context (404 if not)",
                    responses={404: {"model": ErrorResponse}})
        async def has_context(ref: str):
            return respond(self.has_context(ref))

        @router.get("/metrics", summary="Prometheus metrics")
        async def prometheus():
            return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

        scoring = (
            ("/v1/score", "score", "Score independent items", ScoreRequest),
            ("/v1/score_group", "group", "Score candidates that share one prompt and context", GroupRequest),
        )
        for path, kind, summary, model in scoring:

            async def endpoint(request: Request, kind: str = kind):
                return respond(await self.score(kind, pending_body(request, config)))

            router.add_api_route(
                path,
                endpoint,
                methods=["POST"],
                summary=summary,
                name=kind,
                response_model=ScoreResponse,
                responses={**ERRORS, 422: {"model": ScoreResponse, "description": "every item failed on its input (same body)"}},
                openapi_extra=request_body_doc(model),
            )
        return router


class V1Jobs(JobKind):
    """``/v1/jobs``: a ``/v1`` request run as a job; its outcome is the ``/v1`` answer with its status (never a 422: a
    finished job is ``done``, each item's error in its slot), scored on the revision serving its model when it runs."""

    name = V1

    def __init__(self, native: NativeProtocol):
        self.native = native

    def parse(self, ctx: ParseContext, raw: bytes, content_type: str, variant: str) -> Work:
        return self.native.decode(ctx, Wire(raw, content_type), variant)

    def need(self, job: Work) -> int:
        return job.prepared_bytes

    def models(self, job: Work) -> list[str | None]:
        return [job.model]

    async def run(self, job: Work) -> dict[str, Any]:
        outcome = await self.native.serving.score(job, patient=True)
        if isinstance(outcome, Reply):  # refused as a whole (a revision mismatch, a timeout): the job failed, saying why
            return {"status": "failed", "error": outcome.body.get("error")}
        return {"status": "done", **v1_body(outcome, self.native.serving.replica, job.conservative)}

    def failed(self, extra: dict[str, Any], code: ErrorCode | str, message: str) -> dict[str, Any]:
        return {"status": "failed", **error_body(code, message)}

    def answer(self, record: JobRecord, query: str) -> Reply:
        return Reply(200, {"id": record.id, **(record.result or {})})

    def note_swap(self, outcome: dict[str, Any], asked: dict[str, str]) -> None:
        model = outcome.get("model") if isinstance(outcome.get("model"), dict) else {}
        wanted = asked.get(model.get("name", ""))
        if wanted is not None and model.get("revision") not in (None, wanted):  # a swap put other weights in their place
            outcome["accepted_revision"] = wanted
            outcome["note"] = (f"accepted while model {model.get('name')!r} was at revision {wanted}; scored by revision "
                               f"{model['revision']}, which a model swap put in its place")
