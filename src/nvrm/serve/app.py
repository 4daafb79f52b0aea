"""The FastAPI application: routes, limits, auth, errors as JSON."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ContractError, InputError, NvrmError
from ..errors import InternalError
from .batcher import Batcher
from .config import ServeConfig
from .media import RequestError, to_input
from .metrics import Metrics

log = logging.getLogger(__name__)


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": " ".join(str(message).split())}}


def _err(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message), status_code=status, headers=headers)


def item_error(e: BaseException) -> dict:
    if isinstance(e, ContractError):
        code = "contract_violation"
    elif isinstance(e, InternalError) or not isinstance(e, NvrmError):
        code = "internal"
    elif isinstance(e, InputError):
        code = "invalid_input"
    else:
        code = "error"
    return error_body(code, str(e))


def item_result(r: Any) -> dict:
    if isinstance(r, BaseException):
        return item_error(r)
    return {
        "reward": r.reward,
        "num_tokens": r.num_tokens,
        "context_times": list(r.context_times),
        "candidate_times": list(r.candidate_times),
    }


class _State:
    def __init__(self) -> None:
        self.model = None
        self.batcher: Batcher | None = None
        self.load_error: str | None = None


def create_app(model_or_loader: Any, config: ServeConfig, *, on_fatal: Callable[[str], None] | None = None) -> FastAPI:
    """An app serving ``model_or_loader`` (a RewardModel, or a callable that loads one).

    With a loader, the model loads in a background thread at startup:
    ``/healthz`` answers at once, ``/readyz`` and ``/v1/*`` return 503 until it is ready.
    """
    state = _State()
    metrics = Metrics(lambda: state.batcher.depth if state.batcher else 0)

    def install(model) -> None:
        model.max_batch_tokens = config.max_batch_tokens
        state.batcher = Batcher(
            model,
            max_batch_tokens=config.max_batch_tokens,
            max_batch_items=config.max_batch_items,
            max_wait_ms=config.max_wait_ms,
            max_queue_items=config.max_queue_items,
            metrics=metrics,
        )
        state.model = model

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
        else:
            install(model_or_loader)
        yield
        # uvicorn has already waited for in-flight requests (graceful shutdown)
        if state.batcher is not None:
            await asyncio.to_thread(state.batcher.stop, config.drain_timeout_s)

    app = FastAPI(title="nvrm reward service", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.nvrm = state
    app.state.metrics = metrics

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _err(exc.status_code, code, f"{request.method} {request.url.path}: {exc.detail}")

    @app.middleware("http")
    async def observe(request: Request, call_next):
        t = time.perf_counter()
        path = request.url.path
        known = path in ("/healthz", "/readyz", "/metrics", "/v1/info", "/v1/score", "/v1/score_group")
        endpoint = path if known else "other"
        if config.api_key is not None and (path.startswith("/v1/") or path == "/metrics"):
            auth = request.headers.get("authorization", "")
            token = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), config.api_key.encode()):
                metrics.requests.inc(endpoint=endpoint, code="401")
                return _err(401, "unauthorized", "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        try:
            response = await call_next(request)
        except Exception as e:  # noqa: BLE001 - never a bare 500 page
            log.exception("unhandled error on %s", path)
            response = _err(500, "internal", f"{type(e).__name__}: {e}")
        metrics.requests.inc(endpoint=endpoint, code=str(response.status_code))
        metrics.latency.observe(time.perf_counter() - t, endpoint=endpoint)
        return response

    # ------------------------------------------------------------ probes and info

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        if state.model is None:
            return _err(503, "not_ready", state.load_error or "model is loading", {"Retry-After": "2"})
        return {"status": "ready"}

    @app.get("/v1/info")
    async def info():
        if state.model is None:
            return _err(503, "not_ready", state.load_error or "model is loading", {"Retry-After": "2"})
        m = state.model
        return {
            "model": m.info(),
            "contract": {"fingerprint": m.fingerprint, "contract_fields_fingerprint": m.contract.fingerprint, "fields": m.contract.to_dict()},
            "limits": config.public(),
        }

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    # ------------------------------------------------------------ scoring

    async def read_json(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > config.max_body_bytes):
            raise RequestError("request body", f"is larger than the limit of {config.max_body_bytes} bytes", 413, "too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > config.max_body_bytes:
                raise RequestError("request body", f"is larger than the limit of {config.max_body_bytes} bytes", 413, "too_large")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            return await asyncio.to_thread(json.loads, raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError("request body", f"is not valid JSON ({getattr(e, 'msg', e)})") from e

    def ready_or_503():
        if state.model is None:
            return _err(503, "not_ready", state.load_error or "model is loading", {"Retry-After": "2"})
        return None

    def envelope(results: list[dict]) -> dict:
        m = state.model
        return {"results": results, "model": {"revision": m.revision, "path": str(m.path) if m.path else None}, "contract": m.fingerprint}

    def status_for(results: list[dict]) -> int:
        # well-formed request: per-item errors ride in a 200, unless every item failed on its input
        if results and all("error" in r and r["error"]["code"] in ("invalid_input", "contract_violation") for r in results):
            return 422
        return 200

    def check_prompt(value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise RequestError(where, "'prompt' must be a string")
        return value

    async def run(request: Request, parse, submit, count) -> JSONResponse:
        not_ready = ready_or_503()
        if not_ready:
            return not_ready
        try:
            payload = await read_json(request)
            work = await asyncio.to_thread(parse, payload)
        except RequestError as e:
            metrics.rejected.inc(reason=e.code)
            return _err(e.status, e.code, str(e))
        except InputError as e:
            metrics.rejected.inc(reason="bad_request")
            return _err(400, "bad_request", str(e))
        n = count(work)
        limit = min(config.max_items_per_request, config.max_queue_items)
        if n > limit:
            metrics.rejected.inc(reason="too_many_items")
            return _err(413, "too_large", f"request has {n} items; the limit is {limit} per request")
        batcher = state.batcher
        if not batcher.try_admit(n):
            metrics.rejected.inc(reason="queue_full")
            return _err(503, "overloaded", f"queue is full ({batcher.depth} items in flight); retry shortly", {"Retry-After": "1"})
        futures = submit(batcher, work)
        try:
            done = await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(f) for f in futures)), config.request_timeout_s)
        except asyncio.TimeoutError:
            for f in futures:
                f.cancel()
            metrics.rejected.inc(reason="timeout")
            return _err(504, "timeout", f"scoring took longer than {config.request_timeout_s:g} s")
        return done

    @app.post("/v1/score")
    async def score(request: Request):
        def parse(payload: Any):
            if not isinstance(payload, dict) or not isinstance(payload.get("items"), list) or not payload["items"]:
                raise RequestError("request", "expected {\"items\": [{\"prompt\", \"context\", \"candidate\"}, ...]} with at least one item")
            items = []
            for i, it in enumerate(payload["items"]):
                where = f"items[{i}]"
                if not isinstance(it, dict):
                    raise RequestError(where, "must be an object with prompt, context and candidate")
                for key in ("prompt", "context", "candidate"):
                    if key not in it:
                        raise RequestError(where, f"missing '{key}'")
                items.append(
                    (
                        check_prompt(it["prompt"], where),
                        to_input(it["context"], config.allow_dirs, f"{where}.context"),
                        to_input(it["candidate"], config.allow_dirs, f"{where}.candidate"),
                    )
                )
            return items

        out = await run(request, parse, lambda b, items: [b.submit(*it) for it in items], len)
        if isinstance(out, JSONResponse):
            return out
        results = [item_result(r) for r in out]
        return JSONResponse(envelope(results), status_code=status_for(results))

    @app.post("/v1/score_group")
    async def score_group(request: Request):
        def parse(payload: Any):
            if not isinstance(payload, dict):
                raise RequestError("request", 'expected {"prompt", "context", "candidates": [...]}')
            for key in ("prompt", "context", "candidates"):
                if key not in payload:
                    raise RequestError("request", f"missing '{key}'")
            cands = payload["candidates"]
            if not isinstance(cands, list) or not cands:
                raise RequestError("candidates", "must be a non-empty list")
            return (
                check_prompt(payload["prompt"], "request"),
                to_input(payload["context"], config.allow_dirs, "context"),
                [to_input(c, config.allow_dirs, f"candidates[{i}]") for i, c in enumerate(cands)],
            )

        out = await run(request, parse, lambda b, w: [b.submit_group(*w)], lambda w: len(w[2]))
        if isinstance(out, JSONResponse):
            return out
        (res,) = out
        results = [item_result(r) for r in res]
        return JSONResponse(envelope(results), status_code=status_for(results))

    return app
