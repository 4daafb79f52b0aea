"""What routes hand around, with no HTTP in it: a body not read yet (``PendingBody``) and an answer (``Reply``).

Every part of the service answers with a ``Reply`` (status, a JSON body, extra headers); ``routing.respond`` is
the one place that turns it into an HTTP response. A request refused as a whole is a ``Reply`` too, built by
``Reply.error`` (``refusal`` for an ``InputError``), with the error body every route shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from ...errors import InputError, RequestError
from ...protocol import ErrorCode, error_body


@dataclass(frozen=True)
class Reply:
    """One answer: HTTP status, a JSON body and extra headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def error(cls, code: ErrorCode | str, message: str, headers: dict[str, str] | None = None, *, status: int | None = None) -> "Reply":
        """An error answer: ``code``'s HTTP status (or ``status``) and the JSON error body."""
        code = ErrorCode(code)
        return cls(code.status if status is None else status, error_body(code, message), headers or {})

    @property
    def message(self) -> str | None:
        """The one-line message of an error answer (None for any other)."""
        error = self.body.get("error") if isinstance(self.body, dict) else None
        return error.get("message") if isinstance(error, dict) else None


def refusal(e: InputError) -> Reply:
    """The answer to a request refused for ``e``: its code and status (400 ``bad_request`` for a plain input error)."""
    code = e.code if isinstance(e, RequestError) else ErrorCode.BAD_REQUEST
    return Reply.error(code, str(e), status=e.status if isinstance(e, RequestError) else None)


@dataclass(frozen=True)
class PendingBody:
    """A request body not read yet: its content type, declared length, how to read it, and the request's headers
    (lower-case names) for a protocol that reads one (verl-omni's version header)."""

    content_type: str
    content_length: str | None
    read: Callable[[], Awaitable[bytes]]
    headers: Mapping[str, str] = field(default_factory=dict)
