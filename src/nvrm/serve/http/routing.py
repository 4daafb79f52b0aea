"""What every router shares: the error responses it documents (``ERRORS``), a ``Reply`` as an HTTP response
(``respond``), a request's body as a ``PendingBody`` read under the service's limits, and the OpenAPI shape of a
body sent as JSON or multipart (``request_body_doc``)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ...protocol import ErrorResponse
from ..config import ServeConfig
from .messages import PendingBody, Reply
from .request_bodies import read_body

ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 415, 503, 504)}
"""The error answers a scoring route may give, for its OpenAPI ``responses`` (each the one JSON error body)."""


def respond(reply: Reply) -> JSONResponse:
    """The HTTP response of a ``Reply``."""
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers or None)


def pending_body(request: Request, config: ServeConfig) -> PendingBody:
    """The request's body, not read yet: read later under the service's size and time limits."""
    return PendingBody(request.headers.get("content-type", ""), request.headers.get("content-length"),
                       lambda: read_body(request, config.max_body_bytes, config.body_timeout_s), request.headers)


def request_body_doc(model: type) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a route taking ``model`` as JSON, or as the ``request`` part of a multipart form."""
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
