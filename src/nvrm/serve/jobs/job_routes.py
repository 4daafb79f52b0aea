"""``/v1/jobs``: a ``/v1/score`` (``/v1/score_group``) request run as a job of kind ``V1``, fetched by id. The kind
itself (parse, need, run, answer) is the native protocol's (``protocols.native``)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ...protocol import ErrorResponse
from ..http.routing import ERRORS, pending_body, respond
from .job_service import JobService
from .kinds import V1


def jobs_router(jobs: JobService) -> APIRouter:
    """``POST /v1/jobs/score``, ``POST /v1/jobs/score_group`` and ``GET /v1/jobs/{id}``."""
    router = APIRouter(prefix="/v1/jobs")
    config = jobs.serving.config

    @router.post("/score", summary="Submit a /v1/score request as a job; fetch it with GET /v1/jobs/{id}", responses=ERRORS)
    async def job_score(request: Request):
        return respond(await jobs.submit(V1, pending_body(request, config), "score"))

    @router.post("/score_group", summary="Submit a /v1/score_group request as a job; fetch it with GET /v1/jobs/{id}", responses=ERRORS)
    async def job_group(request: Request):
        return respond(await jobs.submit(V1, pending_body(request, config), "group"))

    @router.get("/{job_id}", summary="A job's answer (202 while it runs, 404 once unknown or expired)",
                responses={404: {"model": ErrorResponse}})
    async def job(job_id: str):
        return respond(await jobs.fetch(V1, job_id))

    return router
