"""The FastAPI application, in two steps (after vLLM's ``init_app_state`` / ``build_app``):

    init_state(model_or_loader, config) -> AppState   the service's objects: the logic (``Serving``), the jobs, every
                                                      protocol (each registers its job kind), the ``--watch`` poller
    build_app(state, model_or_loader)   -> FastAPI    the middleware (one bearer guard over every protocol's protected
                                                      paths), each protocol's router, the jobs' and the models', lifespan

``create_app`` is both. With a loader, the model loads in a background thread at startup: ``/healthz`` answers at
once, ``/readyz`` and ``/v1/*`` return 503 until it is ready. OpenAPI docs are at ``/docs``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ..errors import NvrmError
from ..protocol import GroupRequest, ScoreRequest
from .config import ServeConfig
from .http import middleware
from .jobs.job_routes import jobs_router
from .jobs.job_service import JobService
from .models.model_routes import models_router
from .models.model_watch import Watcher
from .models.served import NamedModels, ServedModels
from .protocols.cosmos.cosmos_routes import CosmosProtocol
from .protocols.drm import DrmProtocol
from .protocols.native import NativeProtocol
from .protocols.spec import ProtocolSpec
from .protocols.unirl import UniRLProtocol
from .serving import Serving

log = logging.getLogger(__name__)


@dataclass
class AppState:
    """The service's objects, built once per app."""

    serving: Serving
    jobs: JobService
    protocols: list[ProtocolSpec]
    """Every wire protocol: nvrm's ``/v1``, cosmos-rl's, UniRL's, verl-omni's."""
    cosmos: CosmosProtocol
    watcher: Watcher | None


def init_state(model_or_loader: Any, config: ServeConfig) -> AppState:
    """The service's objects for ``model_or_loader`` (a RewardModel, a callable that loads one, or ``NamedModels``);
    nothing is loaded yet. The job storage is chosen here, once (``--job-store``)."""
    named = model_or_loader if isinstance(model_or_loader, NamedModels) else None
    serving = Serving(config, named.names if named else None, named.rest if named else None)
    jobs = JobService(serving)
    cosmos = CosmosProtocol(serving, jobs)
    protocols: list[ProtocolSpec] = [NativeProtocol(serving, jobs), cosmos, UniRLProtocol(serving), DrmProtocol(serving)]
    return AppState(serving, jobs, protocols, cosmos, _watcher(serving, config))


def create_app(model_or_loader: Any, config: ServeConfig, *, on_fatal: Callable[[str], None] | None = None,
               swap: Callable[..., Awaitable[Any]] | None = None,
               background: Sequence[Callable[[ServedModels], Awaitable[None]]] = ()) -> FastAPI:
    """An app serving ``model_or_loader`` (a RewardModel, a callable that loads one, or ``models.served.NamedModels``).

    ``swap`` replaces how ``PUT /v1/models/{name}`` swaps (``models.model_swap.swap``; Ray Serve's replicas roll instead:
    ``ray.rolling_swap.rolling_swap``); each of ``background`` is run as a task for the app's life (given the served models)."""
    return build_app(init_state(model_or_loader, config), model_or_loader, on_fatal=on_fatal, swap=swap, background=background)


def build_app(state: AppState, model_or_loader: Any, *, on_fatal: Callable[[str], None] | None = None,
              swap: Callable[..., Awaitable[Any]] | None = None,
              background: Sequence[Callable[[ServedModels], Awaitable[None]]] = ()) -> FastAPI:
    """The FastAPI app over ``state``, serving ``model_or_loader`` once its lifespan starts (see ``create_app``)."""
    serving, jobs, config = state.serving, state.jobs, state.serving.config

    def install(model) -> None:
        for protocol in state.protocols:
            protocol.setup(model)
        serving.install(model)
        jobs.start()

    def load() -> None:
        models = serving.models
        try:
            install(model_or_loader())
            log.info("model ready")
        except NvrmError as e:
            models.load_error = str(e)
        except Exception as e:  # noqa: BLE001
            log.exception("model failed to load")
            models.load_error = f"{type(e).__name__}: {e}"
        if models.load_error and on_fatal:
            on_fatal(models.load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        preloaded = isinstance(model_or_loader, NamedModels) and model_or_loader.loaded
        if callable(model_or_loader) and not hasattr(model_or_loader, "score") and not preloaded:
            threading.Thread(target=load, name="nvrm-load", daemon=True).start()
        elif serving.model is None:
            install(model_or_loader() if preloaded else model_or_loader)
        tasks = [asyncio.create_task(state.watcher.run(), name="nvrm-watch")] if state.watcher else []
        tasks += [asyncio.create_task(run(serving.models), name=f"nvrm-background-{i}") for i, run in enumerate(background)]
        yield
        for task in tasks:
            task.cancel()
        jobs.close()
        # uvicorn has already waited for in-flight requests (graceful shutdown); the drain a signal began
        # (nvrm.serve.launcher) is this same one: here it is begun if need be and waited for
        await asyncio.to_thread(serving.drain, config.drain_timeout_s)
        for protocol in state.protocols:
            await asyncio.to_thread(protocol.close)  # cosmos-rl's decode workers exit with it

    app = FastAPI(
        title="nvrm reward service",
        version="1",
        description="WORL-NVRM rewards over HTTP. JSON or multipart (binary .npy frames) requests; JSON responses.",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.nvrm = serving
    app.state.jobs = jobs
    app.state.cosmos = state.cosmos
    app.state.metrics = serving.metrics
    guard = middleware.BearerGuard(config.api_key, [p for protocol in state.protocols for p in protocol.protected])
    middleware.install(app, guard=guard, metrics=serving.metrics)
    for protocol in state.protocols:  # no two routers share a path: the order is the docs'
        protocol.attach_router(app)
    app.include_router(jobs_router(jobs))  # /v1/jobs (the V1 kind is the native protocol's)
    app.include_router(models_router(serving.models, swap))  # GET /v1/models, PUT /v1/models/{name}
    app.openapi = _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> Callable[[], dict]:
    """The app's OpenAPI schema, with the request models the scoring routes read from JSON or multipart."""

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

    return openapi


def _watcher(serving: Serving, config: ServeConfig) -> Watcher | None:
    """The ``--watch`` poller (``models.model_watch.Watcher``), its names checked against the served ones; None without ``--watch``."""
    if not config.watch:
        return None
    from .models.model_watch import parse_watch_specs

    watcher = Watcher(serving.models, parse_watch_specs(config.watch), config.watch_interval_s)
    watcher.check_names(serving.names)
    return watcher
