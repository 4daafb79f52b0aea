"""The service's middleware: bearer auth, per-request metrics, errors as one-line JSON."""

from __future__ import annotations

import hmac
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...protocol import error_body

log = logging.getLogger(__name__)

ENDPOINTS = ("/healthz", "/readyz", "/metrics", "/v1/info", "/v1/score", "/v1/score_group", "/v1/jobs/score", "/v1/jobs/score_group",
             "/api/reward/enqueue", "/api/reward/pull", "/api/reward/ping", "/docs", "/openapi.json")
PROTECTED = ("/v1/", "/api/", "/metrics")


def json_error(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message), status_code=status, headers=headers)


def install(app: FastAPI, *, api_key: str | None, metrics) -> None:
    """Auth on /v1/*, /api/* (cosmos-rl's routes) and /metrics (probes and docs stay open), metrics on every request, JSON errors."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return json_error(exc.status_code, code, f"{request.method} {request.url.path}: {exc.detail}")

    @app.middleware("http")
    async def observe(request: Request, call_next):
        t = time.perf_counter()
        path = request.url.path
        endpoint = path if path in ENDPOINTS else "other"
        if api_key is not None and path.startswith(PROTECTED):
            auth = request.headers.get("authorization", "")
            token = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), api_key.encode()):
                metrics.requests.labels(endpoint=endpoint, code="401").inc()
                return json_error(401, "unauthorized", "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        try:
            response = await call_next(request)
        except Exception as e:  # noqa: BLE001 - never a bare 500 page
            log.exception("unhandled error on %s", path)
            response = json_error(500, "internal", f"{type(e).__name__}: {e}")
        metrics.requests.labels(endpoint=endpoint, code=str(response.status_code)).inc()
        metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - t)
        return response


OVERLOADED = json.dumps(
    error_body("overloaded", "the server is at --max-connections (open connections and requests); retry after the Retry-After seconds")
).encode()


async def over_connection_limit(scope, receive, send) -> None:
    """What a request past ``--max-connections`` gets: the JSON error body every other error has, with Retry-After."""
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(OVERLOADED)).encode()), (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": OVERLOADED, "more_body": False})


def answer_overload_as_json() -> None:
    """uvicorn answers past its ``limit_concurrency`` with a plain-text 503 from each HTTP protocol module's
    ``service_unavailable``, looked up when the request arrives; nvrm's JSON answer takes its place there."""
    import importlib

    for name in ("h11_impl", "httptools_impl"):
        try:
            module = importlib.import_module(f"uvicorn.protocols.http.{name}")
        except ImportError:  # httptools is optional
            continue
        if hasattr(module, "service_unavailable"):
            module.service_unavailable = over_connection_limit
