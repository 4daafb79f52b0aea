"""cosmos-rl's reward-service protocol as one router: ``/api/reward/enqueue``, ``/pull`` and ``/ping``.

The routes are thin (``routes.response`` over ``JobService``); the rollout format and the answers are
in ``cosmos.py`` and ``latents.py``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ....errors import RequestError
from ....protocol import ErrorResponse
from ...jobs.job_service import JobService
from ...admission.requests import read_pull
from ..native import _ERRORS, body_of, response


def cosmos_router(jobs: JobService) -> APIRouter:
    """cosmos-rl's routes: enqueue a rollout, pull its scores by uuid, ping."""
    router = APIRouter(prefix="/api/reward")
    config = jobs.serving.config

    @router.post("/enqueue", summary="cosmos-rl: a rollout (JSON, a newline, .npy latents or frames); answers {\"uuid\"}",
                 responses=_ERRORS)
    async def cosmos_enqueue(request: Request):
        return response(await jobs.enqueue(body_of(request, config)))

    @router.post("/pull", summary="cosmos-rl: the scores of a uuid (form uuid, type); 425 until ready",
                 responses={**_ERRORS, 425: {"model": ErrorResponse}})
    async def cosmos_pull(request: Request):
        try:  # bounded in size and time like every other body (issue 43, item 10)
            uid, kind = await read_pull(request, config.max_body_bytes, config.body_timeout_s)
        except RequestError as e:
            return response(jobs.serving.refused(e))
        return response(await jobs.pull(uid, kind))

    @router.get("/ping", summary="cosmos-rl: liveness of the reward service")
    async def cosmos_ping():
        return response(await jobs.ping())

    @router.post("/ping", summary="cosmos-rl: liveness of the reward service (POST)")
    async def cosmos_ping_post():
        return response(await jobs.ping())

    return router
