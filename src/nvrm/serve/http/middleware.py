"""The service's middleware: one bearer guard over the protected paths, per-request metrics, errors as one-line JSON.

Every protocol names the path prefixes it serves behind the API key (``ProtocolSpec.protected``); the app hands
them all to one ``BearerGuard``, so a route is protected by where it lives, never by a check of its own.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Iterable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...protocol import ErrorCode, error_body

log = logging.getLogger(__name__)

ENDPOINTS = ("/healthz", "/readyz", "/metrics", "/v1/info", "/v1/score", "/v1/score_group", "/v1/jobs/score", "/v1/jobs/score_group",
             "/api/reward/enqueue", "/api/reward/pull", "/api/reward/ping", "/docs", "/openapi.json")
"""The paths metrics label by name (every other path counts as ``other``)."""


def json_error(code: ErrorCode, message: str, headers: dict | None = None, *, status: int | None = None) -> JSONResponse:
    """The JSON error body every error has, as a response (``code``'s status unless ``status``)."""
    return JSONResponse(error_body(code, message), status_code=code.status if status is None else status, headers=headers)


class BearerGuard:
    """The one bearer check: with an API key set, a request under one of ``prefixes`` must carry ``Authorization:
    Bearer KEY`` (compared in constant time); probes, docs and anything outside them stay open."""

    def __init__(self, api_key: str | None, prefixes: Iterable[str]):
        self.api_key = api_key
        self.prefixes = tuple(sorted(set(prefixes)))

    def covers(self, path: str) -> bool:
        """Whether ``path`` needs the key."""
        return self.api_key is not None and path.startswith(self.prefixes)

    def refusal(self, path: str, authorization: str) -> JSONResponse | None:
        """The 401 a request to ``path`` with this ``Authorization`` header gets, or None when it may pass."""
        if not self.covers(path):
            return None
        token = authorization[7:] if authorization.lower().startswith("bearer ") else ""
        if hmac.compare_digest(token.encode(), self.api_key.encode()):  # type: ignore[union-attr]
            return None
        return json_error(ErrorCode.UNAUTHORIZED, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})


def install(app: FastAPI, *, guard: BearerGuard, metrics) -> None:
    """The guard on its paths, metrics on every request, JSON errors (a bare 500 page never)."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(exc.status_code, ErrorCode.HTTP_ERROR)
        return json_error(code, f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code)

    @app.middleware("http")
    async def observe(request: Request, call_next):
        t = time.perf_counter()
        path = request.url.path
        endpoint = path if path in ENDPOINTS else "other"
        refused = guard.refusal(path, request.headers.get("authorization", ""))
        if refused is not None:
            metrics.requests.labels(endpoint=endpoint, code="401").inc()
            return refused
        try:
            response = await call_next(request)
        except Exception as e:  # noqa: BLE001 - never a bare 500 page
            log.exception("unhandled error on %s", path)
            response = json_error(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}")
        metrics.requests.labels(endpoint=endpoint, code=str(response.status_code)).inc()
        metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - t)
        return response


OVERLOADED = json.dumps(
    error_body(ErrorCode.OVERLOADED, "the server is at --max-connections (open connections and requests); retry after the Retry-After seconds")
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
