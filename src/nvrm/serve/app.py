"""The FastAPI application, assembled: the serving object, middleware, routes, lifespan.

    create_app(model_or_loader, config) -> FastAPI

With a loader, the model loads in a background thread at startup: ``/healthz``
answers at once, ``/readyz`` and ``/v1/*`` return 503 until it is ready.
OpenAPI docs are at ``/docs``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import asynccontextmanager
from typing import Any, Awaitable, Callable, Sequence

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ..errors import NvrmError
from ..protocol import GroupRequest, ScoreRequest
from .protocols.cosmos import cosmos_routes
from .protocols import drm as drm_routes
from .http import middleware
from .protocols import native as routes
from .protocols import unirl as unirl_routes
from .config import ServeConfig
from .jobs.job_service import JobService
from .models.model_swap import models_router
from .models.registry import MultiServing, NamedModels
from .serving import Serving  # noqa: F401  (the single-model service; MultiServing extends it)

log = logging.getLogger(__name__)


def create_app(model_or_loader: Any, config: ServeConfig, *, on_fatal: Callable[[str], None] | None = None,
               swap: Callable[..., Awaitable[Any]] | None = None,
               background: Sequence[Callable[[MultiServing], Awaitable[None]]] = ()) -> FastAPI:
    """An app serving ``model_or_loader`` (a RewardModel, a callable that loads one, or ``models.NamedModels``).

    ``swap`` replaces how ``PUT /v1/models/{name}`` swaps (``model_swap.swap``; Ray Serve's replicas roll instead:
    ``ray_swaps.rolling_swap``); each of ``background`` is run as a task for the app's life (given the service)."""
    named = model_or_loader if isinstance(model_or_loader, NamedModels) else None
    state = MultiServing(config, named.names if named else None, named.rest if named else None)
    jobs = JobService(state)
    watcher = _watcher(state, config)

    def install(model) -> None:
        jobs.install_decoder(model.device)
        state.install(model)

    def load() -> None:
        try:
            install(model_or_loader())
            log.info("model ready")
        except NvrmError as e:
            state.load_error = str(e)
        except Exception as e:  # noqa: BLE001
            log.exception("model failed to load")
            state.load_error = f"{type(e).__name__}: {e}"
        if state.load_error and on_fatal:
            on_fatal(state.load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if callable(model_or_loader) and not hasattr(model_or_loader, "score"):
            threading.Thread(target=load, name="nvrm-load", daemon=True).start()
        elif state.model is None:
            install(model_or_loader)
        tasks = [asyncio.create_task(watcher.run(), name="nvrm-watch")] if watcher else []
        tasks += [asyncio.create_task(run(state), name=f"nvrm-background-{i}") for i, run in enumerate(background)]
        yield
        for task in tasks:
            task.cancel()
        jobs.store.cancel_all()
        # uvicorn has already waited for in-flight requests (graceful shutdown); the drain a signal began
        # (nvrm.serve.launcher) is this same one: here it is begun if need be and waited for
        await asyncio.to_thread(state.drain, config.drain_timeout_s)
        if jobs.decodes is not None:
            await asyncio.to_thread(jobs.decodes.close)  # the decode workers exit with it

    app = FastAPI(
        title="nvrm reward service",
        version="1",
        description="WORL-NVRM rewards over HTTP. JSON or multipart (binary .npy frames) requests; JSON responses.",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.nvrm = state
    app.state.jobs = jobs
    app.state.metrics = state.metrics
    middleware.install(app, api_key=config.api_key, metrics=state.metrics)
    for router in (routes.v1_router(state), routes.jobs_router(jobs), cosmos_routes.cosmos_router(jobs)):  # one per protocol
        app.include_router(router)
    for router in (unirl_routes.unirl_router(state), drm_routes.drm_router(state)):  # UniRL's and verl-omni's (issue 41)
        app.include_router(router)
    app.include_router(models_router(state, swap))  # GET /v1/models, PUT /v1/models/{name} (nvrm.serve.models.model_swap)

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (ScoreRequest, GroupRequest):
                s = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(s.pop("$defs", {}))
                components[model.__name__] = s
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _watcher(state: MultiServing, config: ServeConfig):
    """The ``--watch`` poller (``model_watch.Watcher``), its names checked against the served ones; None without ``--watch``."""
    if not config.watch:
        return None
    from .models.model_watch import Watcher, parse_watch_specs

    watcher = Watcher(state, parse_watch_specs(config.watch), config.watch_interval_s)
    watcher.check_names(state.names)
    return watcher
