"""The service's endpoints, thin: each turns its HTTP request into a call of ``serving.Serving`` and the
``Reply`` back into a response. Nothing heavier than reading the body runs on the event loop."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..protocol import ErrorResponse, GroupRequest, ScoreRequest, ScoreResponse
from .metrics import CONTENT_TYPE_LATEST
from .job_service import JobService
from .serving import Body, Reply, Serving
from .transport import read_body

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
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers or None)


def install(app: FastAPI, serving: Serving, jobs: JobService) -> None:
    """The endpoints: each hands its request to ``serving`` (or ``jobs``) and returns the ``Reply`` it gets."""
    config, metrics = serving.config, serving.metrics

    def body(request: Request) -> Body:
        return Body(request.headers.get("content-type", ""), request.headers.get("content-length"),
                    lambda: read_body(request, config.max_body_bytes, config.body_timeout_s))

    @app.get("/readyz", summary="Readiness: 200 once the model is loaded, 503 while loading or shutting down", responses={503: {"model": ErrorResponse}})
    async def readyz():
        return response(serving.ready())

    @app.get("/healthz", summary="Liveness: answers as soon as the process runs")
    async def healthz():
        return {"status": "ok"}

    @app.get("/v1/info", summary="Model, contract and limits")
    async def info():
        return response(serving.info())

    @app.post("/v1/contexts", summary="Keep a context on the server; later requests name it {\"ref\": hash}", responses=_ERRORS)
    async def upload_context(request: Request):
        return response(await serving.upload(body(request)))

    @app.get("/v1/contexts/{ref}", summary="Whether this server holds an uploaded context (404 if not)", responses={404: {"model": ErrorResponse}})
    async def has_context(ref: str):
        return response(serving.has_context(ref))

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/jobs/score", summary="Submit a /v1/score request as a job; fetch it with GET /v1/jobs/{id}", responses=_ERRORS)
    async def job_score(request: Request):
        return response(await jobs.submit("score", body(request)))

    @app.post("/v1/jobs/score_group", summary="Submit a /v1/score_group request as a job; fetch it with GET /v1/jobs/{id}", responses=_ERRORS)
    async def job_group(request: Request):
        return response(await jobs.submit("group", body(request)))

    @app.get("/v1/jobs/{job_id}", summary="A job's answer (202 while it runs, 404 once unknown or expired)", responses={404: {"model": ErrorResponse}})
    async def job(job_id: str):
        return response(jobs.fetch(job_id))

    @app.post("/api/reward/enqueue", summary="cosmos-rl: a rollout (JSON, a newline, .npy latents or frames); answers {\"uuid\"}", responses=_ERRORS)
    async def cosmos_enqueue(request: Request):
        return response(await jobs.enqueue(body(request)))

    @app.post("/api/reward/pull", summary="cosmos-rl: the scores of a uuid (form uuid, type); 425 until ready", responses={**_ERRORS, 425: {"model": ErrorResponse}})
    async def cosmos_pull(request: Request):
        form = await request.form()
        return response(jobs.pull(str(form.get("uuid", "")), str(form.get("type", "") or "")))

    @app.get("/api/reward/ping", summary="cosmos-rl: liveness of the reward service")
    async def cosmos_ping():
        return response(jobs.ping())

    @app.post("/api/reward/ping", summary="cosmos-rl: liveness of the reward service (POST)")
    async def cosmos_ping_post():
        return response(jobs.ping())

    scoring = (
        ("/v1/score", "score", "Score independent items", ScoreRequest),
        ("/v1/score_group", "group", "Score candidates that share one prompt and context", GroupRequest),
    )
    for path, kind, summary, model in scoring:

        async def endpoint(request: Request, kind: str = kind):
            return response(await serving.score(kind, body(request)))

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
