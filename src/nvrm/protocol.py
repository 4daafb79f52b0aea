"""The reward service's wire format: pydantic models shared by the server and the client.

Torch-free: ``nvrm.client`` imports this without loading the runtime.

Requests (``POST /v1/score``, ``POST /v1/score_group``) are JSON, or
``multipart/form-data`` whose ``request`` part is that JSON and whose other
parts carry bulk bytes: a VIDEO ``{"part": "c0", "fps": 8}`` names a part that
holds a raw ``.npy`` uint8 ``(T, H, W, 3)`` array (with ``fps``) or, without
``fps``, encoded video bytes. Responses are always JSON.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

BINARY_PART_CONTENT_TYPE = "application/octet-stream"
REQUEST_PART = "request"
"""Name of the multipart part that holds the JSON request."""

ADMIN_HEADER = "X-Nvrm-Admin-Key"
"""The header an admin request (a model swap, ``PUT /v1/models/NAME``) carries the admin key in (``--admin-key-env``);
header names are case-insensitive on the wire."""

JOB_ID = re.compile(r"[0-9a-f]{32}")
"""A job id as the service issues it (``POST /v1/jobs/...``, a uuid4's hex): anything else is refused unread, by the
server before any store key is built from it and by the client before it is polled."""

ROUTE_HEADER = "serve_multiplexed_model_id"
"""Header with the content hash of a request's context: Ray Serve routes requests that carry the same
value to the replica that already served it (``nvrm.serve.ray.deployment``); a plain server ignores it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Video(_Strict):
    """A context or candidate: exactly one of ``path``, ``data``, ``frames``, ``part`` or ``ref``."""

    path: str | None = Field(None, description="a file inside one of the server's --allow-dir folders")
    data: str | None = Field(None, description="base64 of encoded video (or image) bytes")
    frames: str | None = Field(None, description="base64 of a .npy uint8 (T, H, W, 3) array; needs fps, or times + sampled")
    part: str | None = Field(None, description="name of a multipart part: .npy frames with fps (or times + sampled), else encoded video bytes")
    fps: float | None = Field(None, description="frame rate of frames / a .npy part", gt=0)
    times: list[float] | None = Field(
        None, description="frames already sampled by the contract's time plan: each frame's source time (s); needs 'sampled'"
    )
    sampled: str | None = Field(None, description="the contract fingerprint ('contract_fields_fingerprint' of /v1/info) the frames were sampled under")
    ref: str | None = Field(None, description="a context uploaded before (POST /v1/contexts), named by its content hash")

    @model_validator(mode="after")
    def _one_kind(self) -> "Video":
        kinds = [k for k in ("path", "data", "frames", "part", "ref") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("needs exactly one of 'path', 'data', 'frames', 'part' or 'ref'")
        if (self.times is None) != (self.sampled is None):
            raise ValueError("'times' and 'sampled' go together (frames sampled by the client under a contract)")
        if self.times is not None and self.frames is None and self.part is None:
            raise ValueError("'times' describe 'frames' or a .npy 'part'")
        if self.frames is not None and self.fps is None and self.times is None:
            raise ValueError("'frames' needs its 'fps' (or 'times' and 'sampled')")
        return self


class Item(_Strict):
    prompt: str
    context: Video | None = Field(description="the preceding video; null (only where the server's contract has no_context) for none")
    candidate: Video


class ScoreRequest(_Strict):
    """``POST /v1/score``: independent items, each with its own prompt and context."""

    items: Annotated[list[Item], Field(min_length=1)]
    exact: bool = Field(False, description="score every item alone (bit-identical to in-process score())")
    model: str | None = Field(None, description="which served model scores it (GET /v1/models); default the first")
    expect_revision: str | None = Field(None, description="refuse (409) unless the model is at this revision")
    conservative: float | None = Field(None, ge=0, allow_inf_nan=False, description="λ: each result also carries conservative_reward = "
                                       "reward - λ * uncertainty (the model needs a guard; 400 otherwise)")


class ContextUpload(_Strict):
    """``POST /v1/contexts``: keep a context on the server; later requests name it by ``ref``."""

    context: Video


class GroupRequest(_Strict):
    """``POST /v1/score_group``: candidates that share one prompt and context (prefix reuse)."""

    prompt: str
    context: Video | None = Field(description="the preceding video; null (only where the server's contract has no_context) for none")
    candidates: Annotated[list[Video], Field(min_length=1)]
    exact: bool = False
    model: str | None = Field(None, description="which served model scores it (GET /v1/models); default the first")
    expect_revision: str | None = Field(None, description="refuse (409) unless the model is at this revision")
    conservative: float | None = Field(None, ge=0, allow_inf_nan=False, description="λ: each result also carries conservative_reward = "
                                       "reward - λ * uncertainty (the model needs a guard; 400 otherwise)")


class ErrorCode(str, Enum):
    """Every error code the service sends and the client reads, each with the HTTP status it answers with.

    A ``str``: it compares equal to (and serialises as) its code, so ``ErrorCode("overloaded").status == 503``
    and ``body["error"]["code"] == ErrorCode.OVERLOADED``. Per-item codes ride in a 200 (``status`` is what a
    whole request gets when every item failed that way). Write a code here once; everything else names it."""

    BAD_REQUEST = "bad_request", 400
    UNAUTHORIZED = "unauthorized", 401
    FORBIDDEN = "forbidden", 403
    NOT_FOUND = "not_found", 404
    CONTEXT_UNKNOWN = "context_unknown", 404
    JOB_UNKNOWN = "job_unknown", 404
    METHOD_NOT_ALLOWED = "method_not_allowed", 405
    REQUEST_TIMEOUT = "request_timeout", 408
    TOO_LARGE = "too_large", 413
    CONTRACT_MISMATCH = "contract_mismatch", 409
    MODEL_UNKNOWN = "model_unknown", 400
    REVISION_MISMATCH = "revision_mismatch", 409
    SWAP_IN_PROGRESS = "swap_in_progress", 409
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type", 415
    HTTP_ERROR = "http_error", 400
    OVERLOADED = "overloaded", 503
    NOT_READY = "not_ready", 503
    SHUTTING_DOWN = "shutting_down", 503
    UNAVAILABLE = "unavailable", 503
    BACKEND_UNAVAILABLE = "backend_unavailable", 503
    HUB_UNAVAILABLE = "hub_unavailable", 502
    JOB_STORE_FULL = "job_store_full", 503
    JOB_STORE_UNAVAILABLE = "job_store_unavailable", 503
    TIMEOUT = "timeout", 504
    INTERNAL = "internal", 500
    # per item
    INVALID_INPUT = "invalid_input", 422
    CONTRACT_VIOLATION = "contract_violation", 422
    LIMIT_EXCEEDED = "limit_exceeded", 422

    status: int

    def __new__(cls, code: str, status: int) -> "ErrorCode":
        member = str.__new__(cls, code)
        member._value_ = code
        member.status = status
        return member

    def __str__(self) -> str:
        return self.value

    @classmethod
    def read(cls, code: Any) -> "ErrorCode | str | None":
        """A code off the wire: its member when known, else as sent (a newer server's code), None when absent."""
        if code is None:
            return None
        return cls._value2member_map_.get(code, str(code)) if isinstance(code, str) else str(code)  # type: ignore[return-value]

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


INPUT_CODES = frozenset({ErrorCode.INVALID_INPUT, ErrorCode.CONTRACT_VIOLATION, ErrorCode.LIMIT_EXCEEDED})
"""Item error codes that are the input's fault (a request where every item has one is a 422)."""


class ErrorDetail(BaseModel):
    code: str = Field(description="one of: " + ", ".join(c.value for c in ErrorCode) + " (protocol.ErrorCode)")
    message: str = Field(description="one line naming the input and the reason")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Score(BaseModel):
    reward: float = Field(description="raw bf16 logit of the reward head; higher is preferred")
    num_tokens: int
    context_times: list[float]
    candidate_times: list[float]
    off_contract: list[str] = Field(default_factory=list, description="why this reward is not the release contract's (opt-ins used); absent when it is")
    backend: str | None = Field(None, description="'vllm' when vLLM computed it (never exact); absent for nvrm's engine")
    cached_tokens: int | None = Field(None, description="vLLM backend: prompt tokens read from its prefix cache")
    uncertainty: float | None = Field(None, description="how far to trust the reward, in reward units (the model's guard; "
                                      "higher: less trustworthy); absent when the model has no guard")
    conservative_reward: float | None = Field(None, description="reward - conservative * uncertainty, when the request asked for it")


class ItemError(BaseModel):
    error: ErrorDetail


ItemResult = Union[Score, ItemError]


class ModelInfo(BaseModel):
    name: str | None = None
    revision: str | None = None
    path: str | None = None


class ScoreResponse(BaseModel):
    """One result per item (or candidate), in request order."""

    results: list[ItemResult]
    model: ModelInfo
    contract: str = Field(description="preprocessing fingerprint: comparable rewards share it")
    replica: str | None = Field(None, description="which server process answered")
    conservative: float | None = Field(None, description="the λ of each result's conservative_reward, when the request asked for one")


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": " ".join(str(message).split())}}


_PHRASES = {
    "string_type": "must be a string",
    "list_type": "must be a list",
    "bool_type": "must be true or false",
    "float_type": "must be a number",
    "model_type": "must be an object",
    "dict_type": "must be an object",
    "missing": "is missing",
    "extra_forbidden": "is not a known field",
    "too_short": "must be a non-empty list",
    "greater_than": "must be a positive number",
    "finite_number": "must be a finite number",
    "greater_than_equal": "must be a number >= 0",
}


def describe_validation_error(e: ValidationError, root: str = "request") -> tuple[str, str]:
    """The first problem of a pydantic error: (where, what), e.g. ``("request.items[0].prompt", "must be a string")``."""
    err = e.errors(include_url=False)[0]
    where = root
    for part in err.get("loc", ()):
        where += f"[{part}]" if isinstance(part, int) else f".{part}"
    message = _PHRASES.get(err["type"])
    if message is None:
        message = str(err.get("msg", "is invalid")).removeprefix("Value error, ")
    more = len(e.errors()) - 1
    return where, message + (f" (and {more} more problem{'s' if more > 1 else ''})" if more > 0 else "")


Kind = Literal["score", "group"]


def npy_bytes(frames) -> bytes:
    """A uint8 (T, H, W, 3) array as raw .npy bytes (what a binary part carries)."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(frames), allow_pickle=False)
    return buf.getvalue()


def encode_frames(frames) -> str:
    """A uint8 (T, H, W, 3) array as base64 .npy (the JSON form of ``frames``)."""
    import base64

    return base64.b64encode(npy_bytes(frames)).decode("ascii")


def context_ref(fingerprint: str, *, frames=None, times=None, data: "bytes | memoryview | None" = None) -> str:
    """The content hash that names an uploaded context: sha256 over the contract fingerprint, the kind,
    and the content (sampled frames with their times and shape, or encoded bytes). Client and server
    compute it the same way; a client can only name (and so only learn about) content it already has."""
    import hashlib
    import json

    h = hashlib.sha256(b"nvrm-context-v1\0" + fingerprint.encode("ascii") + b"\0")
    if data is not None:
        h.update(b"bytes\0")
        h.update(data)
    else:
        import numpy as np

        arr = np.ascontiguousarray(frames)
        h.update(b"frames\0" + json.dumps({"shape": list(arr.shape), "times": [float(t) for t in times]}, sort_keys=True).encode() + b"\0")
        h.update(memoryview(arr).cast("B"))
    return h.hexdigest()
