"""Decoding a request: body -> validated request -> media (decoded, confined, keyed) -> ``Work``.

Runs in a worker thread (``asyncio.to_thread``), never on the event loop. Pure of the service's
admission and scheduling: ``serving`` decides what happens to a ``Work``.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from ...errors import InputError, RequestError
from ...protocol import ContextUpload, ErrorCode, GroupRequest, ScoreRequest, describe_validation_error
from .budget import prepared_bytes
from .media import HASH_SECONDS, Media, ref_of, stored, to_media
from ..http.transport import parse_body


class Work:
    """A parsed request: what to submit and how many items it admits."""

    def __init__(self, kind: str, exact: bool, items: list[tuple[str, Any, Any]] | None = None, group: tuple[str, Any, list[Any]] | None = None):
        self.kind, self.exact, self.items, self.group = kind, exact, items, group
        self.cpu_seconds = 0.0
        """CPU time parsing and decoding took (the parse thread's own time, not waiting)."""
        self.hash_seconds = 0.0
        """CPU time hashing the contexts for the shared-context cache."""
        self.prepared_bytes = 0
        """An upper bound of the memory its prepared videos take (``nvrm.serve.admission.budget``)."""
        self.body_bytes = 0
        """The size of the body it was parsed from (its media may be views into it)."""
        self.model: str | None = None
        """The served model it names (``nvrm.serve.models.registry``); None: the first."""
        self.expect_revision: str | None = None
        """The revision it must be scored by (409 otherwise); None: any."""
        self.fingerprint: str | None = None
        """The contract fingerprint of the model that parsed it (a swap to another contract meanwhile: retry)."""

    @property
    def size(self) -> int:
        return len(self.items) if self.items is not None else len(self.group[2])  # type: ignore[index]


def parse_work(state, raw: bytes, content_type: str, kind: str) -> Work:
    """Body -> validated request -> media (decoded, confined, keyed). Runs in a worker thread."""
    cpu0 = time.thread_time()
    HASH_SECONDS.value = 0.0
    limits = state.model.limits
    max_items = min(limits.max_request_items, state.config.max_queue_items)
    body = parse_body(raw, content_type, max_items, 2 * limits.max_context_samples)
    if hasattr(state, "for_payload"):  # several served models (nvrm.serve.models.registry): the one it names parses it
        state = state.for_payload(body.payload)
        limits = state.model.limits
    model = ScoreRequest if kind == "score" else GroupRequest
    listed = body.payload.get("items" if kind == "score" else "candidates") if isinstance(body.payload, dict) else None
    n = len(listed) if isinstance(listed, list) else 0  # counted before validation builds an error per element
    if n <= max_items:
        try:
            req = model.model_validate(body.payload)
        except ValidationError as e:
            raise RequestError(*describe_validation_error(e)) from e
    if n > max_items:
        which = "max_request_items" if limits.max_request_items <= state.config.max_queue_items else "max_queue_items"
        raise RequestError("request", f"has {n} items; the limit is {max_items} per request ({which})", code=ErrorCode.TOO_LARGE)

    def media(video, where: str, role: str = "candidate"):
        # only contexts are shared across requests, so only they are hashed
        keyed = role == "context" and state.cache.enabled
        return to_media(video, state.config.allow_dirs, where, body.parts, limits, keyed=keyed, role=role, contract=state.model.contract, store=state.store)

    def context(video, where: str):
        if video is None:  # no context: the model's contract refuses it unless it has the no_context opt-in
            return Media(None, "none")
        m = media(video, where, "context")
        # an inline sampled clip or video bytes is kept under its content hash: later requests (from any
        # client) name it by ref, and share its prepared frames and prefill with this one
        inline = video.times is not None or video.data is not None or (video.part is not None and video.fps is None)
        if inline and state.store.max_bytes > 0:
            ref = ref_of(m, state.model.contract.fingerprint)
            held = state.store.peek(ref)
            if held is None:  # keep a copy that owns its memory (not a view of this request's body)
                held, size = stored(m, ref)
                if state.store.put(ref, held, size):
                    state.metrics.context_kept.inc()
            # this request scores its own frames (freed with its body) under the store's key: holding the
            # store's copy instead would keep it alive, uncounted, once the store evicts it
            m = Media(m.value, held.key)
        return m

    if kind == "score":
        items = [
            (it.prompt, context(it.context, f"items[{i}].context"), media(it.candidate, f"items[{i}].candidate"))
            for i, it in enumerate(req.items)  # type: ignore[union-attr]
        ]
        work = Work(kind, req.exact, items=items)
    else:
        group = (req.prompt, context(req.context, "context"), [media(c, f"candidates[{i}]") for i, c in enumerate(req.candidates)])  # type: ignore[union-attr]
        work = Work(kind, req.exact, group=group)
    work.model, work.expect_revision, work.fingerprint = req.model, req.expect_revision, state.model.fingerprint  # type: ignore[union-attr]
    work.hash_seconds = HASH_SECONDS.value
    work.body_bytes = len(raw)
    videos = [(c.value, "context", c.key) for _, c, _ in work.items] + [(d.value, "candidate", "") for _, _, d in work.items] if work.items is not None else (
        [(work.group[1].value, "context", work.group[1].key)] + [(d.value, "candidate", "") for d in work.group[2]]  # type: ignore[index]
    )
    work.prepared_bytes = prepared_bytes(videos, state.model.contract, limits, state.model.engine.codec is not None)
    work.cpu_seconds = time.thread_time() - cpu0 - work.hash_seconds
    return work


def parse_upload(state, raw: bytes, content_type: str) -> dict[str, Any]:
    """``POST /v1/contexts``: validate, sample-check and keep one context; answer its ref. Runs in a worker thread."""
    limits = state.model.limits
    body = parse_body(raw, content_type, 1)
    try:
        req = ContextUpload.model_validate(body.payload)
    except ValidationError as e:
        raise RequestError(*describe_validation_error(e)) from e
    if req.context.ref is not None or req.context.path is not None:
        raise InputError("context", "upload the content itself: sampled frames (with times and sampled) or encoded video bytes")
    if req.context.times is None and req.context.data is None and (req.context.part is None or req.context.fps is not None):
        raise InputError("context", "frames are uploaded sampled (with times and sampled); read /v1/info for the contract's time plan")
    media = to_media(req.context, (), "context", body.parts, limits, role="context", contract=state.model.contract)
    ref = ref_of(media, state.model.contract.fingerprint)
    kept, size = stored(media, ref)
    if state.store.max_bytes <= 0:
        raise RequestError("context", "context uploads are off on this server (--context-store-mb 0)", code=ErrorCode.FORBIDDEN)
    if not state.store.put(ref, kept, size):
        raise RequestError("context", f"is {size} bytes, more than the whole context store ({state.store.max_bytes} bytes, --context-store-mb)",
                           code=ErrorCode.TOO_LARGE)
    return {"ref": ref, "bytes": size}




PULL_BODY_BYTES = 64 * 1024
"""The most a cosmos-rl pull body (a form with a uuid and a type) may hold, under ``--max-body-mb`` too."""


async def read_pull(request, max_bytes: int, timeout_s: float | None) -> tuple[str, str]:
    """The ``uuid`` and ``type`` of a ``POST /api/reward/pull`` form (urlencoded or multipart), its body read
    like every other one: refused (413) past ``min(max_bytes, PULL_BODY_BYTES)`` while it streams in, and
    (408) when it has not arrived within ``timeout_s``. Only then is the bounded body parsed as a form."""
    from starlette.formparsers import MultiPartException
    from starlette.requests import Request

    from ..http.transport import read_body

    raw = bytes(await read_body(request, min(max_bytes, PULL_BODY_BYTES), timeout_s))

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    try:
        form = await Request(request.scope, receive).form()
    except MultiPartException as e:
        raise RequestError("pull body", f"is not a valid form ({e.message})") from e
    return str(form.get("uuid", "")), str(form.get("type", "") or "")
