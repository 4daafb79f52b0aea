"""The models room's endpoints: ``GET /v1/models`` lists the served models, the admin's ``PUT /v1/models/{name}``
swaps one under load (``model_swap``). A per-model route (``/v1/models/{name}/...``) belongs here too."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from fastapi import APIRouter, Request

from ...errors import RequestError
from ..http.messages import Reply
from ..http.routing import respond
from ...protocol import ADMIN_HEADER
from .model_swap import allowed_path, check_admin, from_hub, swap, swap_body
from .served import ServedModels


def models_router(models: ServedModels, swap_with: Callable[..., Any] | None = None) -> APIRouter:
    """``GET /v1/models`` and the admin's ``PUT /v1/models/{name}`` (swapped by ``swap_with``, else by ``model_swap.swap``;
    Ray Serve's replicas roll instead: ``ray.rolling_swap.rolling_swap``)."""
    router = APIRouter()
    swap_with = swap_with or swap

    @router.get("/v1/models", summary="The served models: name, revision (manifest sha256), contract, state, memory")
    async def list_models():
        return respond(models.listing())

    @router.get("/v1/models/{name}/monitor", summary="Is the policy gaming this model's reward? Rolling reward, uncertainty and "
                "frame statistics of its recent items against its guard's reference, and a state (ok / suspect) with a one-line reason")
    async def monitor(name: str):
        if (busy := models.not_ready()) is not None:
            return respond(busy)
        try:
            entry = models.registry.current(name)
        except RequestError as e:
            return respond(models.refused(e))
        return respond(Reply(200, {"name": entry.name, "revision": entry.digest, **entry.monitor.snapshot()}))

    @router.put("/v1/models/{name}", summary='Swap a model under load: {"path": BUNDLE_DIR} under --allow-dir, or {"repo": ..., '
                '"revision": ...} from the Hub, with the admin key')
    async def put_model(name: str, request: Request):
        if (refused := check_admin(models, request.headers.get(ADMIN_HEADER))) is not None:
            return respond(refused)
        if (busy := models.not_ready()) is not None:
            return respond(busy)
        try:
            models.registry.current(name)
            body = swap_body(await request.body())
            path = await asyncio.to_thread(from_hub, body) if "repo" in body else allowed_path(models, body)
        except RequestError as e:
            return respond(models.refused(e))
        return respond(await swap_with(models, name, path))

    return router
