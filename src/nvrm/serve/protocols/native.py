"""The service's endpoints, thin: each turns its HTTP request into a call of ``serving.Serving`` and the
``Reply`` back into a response. Nothing heavier than reading the body runs on the event loop.

One ``APIRouter`` per protocol: ``v1_router`` (nvrm's own: probes, ``/v1``, ``/metrics``), ``jobs_router``
(``/v1/jobs``) and, in ``cosmos_routes.py``, cosmos-rl's ``/api/reward``; ``app.create_app`` mounts all three."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...protocol import ErrorResponse, GroupRequest, ScoreRequest, ScoreResponse
from ..config import ServeConfig
from ..metrics import CONTENT_TYPE_LATEST
from ..jobs.job_service import JobService
from ..serving import Body, Reply, Serving
from ..http.transport import read_body

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 415, 503, 504)}


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


def response(reply: Reply) -> JSONResponse:
    """The HTTP response of a ``Reply``."""
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers or None)


def body_of(request: Request, config: ServeConfig) -> Body:
    """The request's body, not read yet: read later under the service's size and time limits."""
    return Body(request.headers.get("content-type", ""), request.headers.get("content-length"),
                lambda: read_body(request, config.max_body_bytes, config.body_timeout_s))


def v1_router(serving: Serving) -> APIRouter:
    """nvrm's own protocol: the probes, ``/v1/info``, contexts, ``/v1/score``, ``/v1/score_group`` and ``/metrics``."""
    router = APIRouter()
    config, metrics = serving.config, serving.metrics

    @router.get("/readyz", summary="Readiness: 200 once the model is loaded, 503 while loading or shutting down",
                responses={503: {"model": ErrorResponse}})
    async def readyz():
        return response(serving.ready())

    @router.get("/healthz", summary="Liveness: answers as soon as the process runs")
    async def healthz():
        return {"status": "ok"}

    @router.get("/v1/info", summary="Model, contract and limits")
    async def info():
        return response(serving.info())

    @router.post("/v1/contexts", summary="Keep a context on the server; later requests name it {\"ref\": hash}", responses=_ERRORS)
    async def upload_context(request: Request):
        return response(await serving.upload(body_of(request, config)))

    @router.get("/v1/contexts/{ref}", summary="Whether this server holds an uploaded context (404 if not)",
                responses={404: {"model": ErrorResponse}})
    async def has_context(ref: str):
        return response(serving.has_context(ref))

    @router.get("/metrics", summary="Prometheus metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    scoring = (
        ("/v1/score", "score", "Score independent items", ScoreRequest),
        ("/v1/score_group", "group", "Score candidates that share one prompt and context", GroupRequest),
    )
    for path, kind, summary, model in scoring:

        async def endpoint(request: Request, kind: str = kind):
            return response(await serving.score(kind, body_of(request, config)))

        router.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            summary=summary,
            name=kind,
            response_model=ScoreResponse,
            responses={**_ERRORS, 422: {"model": ScoreResponse, "description": "every item failed on its input (same body)"}},
            openapi_extra=_request_body_doc(model),
        )
    return router


def jobs_router(jobs: JobService) -> APIRouter:
    """``/v1/jobs``: a ``/v1/score`` (``/v1/score_group``) request run as a job, fetched by id."""
    router = APIRouter(prefix="/v1/jobs")
    config = jobs.serving.config

    @router.post("/score", summary="Submit a /v1/score request as a job; fetch it with GET /v1/jobs/{id}", responses=_ERRORS)
    async def job_score(request: Request):
        return response(await jobs.submit("score", body_of(request, config)))

    @router.post("/score_group", summary="Submit a /v1/score_group request as a job; fetch it with GET /v1/jobs/{id}", responses=_ERRORS)
    async def job_group(request: Request):
        return response(await jobs.submit("group", body_of(request, config)))

    @router.get("/{job_id}", summary="A job's answer (202 while it runs, 404 once unknown or expired)",
                responses={404: {"model": ErrorResponse}})
    async def job(job_id: str):
        return response(await jobs.fetch(job_id))

    return router
