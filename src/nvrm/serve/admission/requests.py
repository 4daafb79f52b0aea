"""Decoding a request: body -> validated request -> media (decoded, confined, keyed) -> ``Work``.

Runs in a worker thread (``asyncio.to_thread``), never on the event loop, over a ``ParseContext``: what decoding
reads of the service (its settings, its uploaded contexts, and a snapshot of the served models' contracts and
caches, taken when the request was read). Pure of admission and scheduling: ``serving`` decides what happens
to a ``Work``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from ...errors import InputError, RequestError
from ...protocol import ContextUpload, ErrorCode, GroupRequest, ScoreRequest, describe_validation_error
from ..config import ServeConfig
from ..http.request_bodies import parse_body
from .budget import prepared_bytes
from .media import HASH_SECONDS, Media, ref_of, stored, to_media


class Work:
    """A decoded request: what to submit (single items, or one group) and how many items it admits."""

    def __init__(self, kind: str, exact: bool, items: list[tuple[str, Any, Any]] | None = None, group: tuple[str, Any, list[Any]] | None = None,
                 *, model: str | None = None):
        self.kind, self.exact, self.items, self.group = kind, exact, items, group
        self.cpu_seconds = 0.0
        """CPU time parsing and decoding took (the parse thread's own time, not waiting)."""
        self.hash_seconds = 0.0
        """CPU time hashing the contexts for the shared-context cache."""
        self.prepared_bytes = 0
        """An upper bound of the memory its prepared videos take (``nvrm.serve.admission.budget``)."""
        self.body_bytes = 0
        """The size of the body it was parsed from (its media may be views into it)."""
        self.model: str | None = model
        """The served model it names (``nvrm.serve.models``); None: the first."""
        self.expect_revision: str | None = None
        """The weights digest it must be scored by (``expect_revision`` on the wire; 409 otherwise); None: any."""
        self.fingerprint: str | None = None
        """The contract fingerprint of the model that parsed it (a swap to another contract meanwhile: retry)."""
        self.conservative: float | None = None
        """λ of the conservative reward each answer carries beside the raw one (``reward - λ * uncertainty``); None: not asked."""

    @property
    def size(self) -> int:
        return len(self.items) if self.items is not None else len(self.group[2])  # type: ignore[index]


@dataclass(frozen=True)
class ParseTarget:
    """One served model as decoding sees it: the model (its contract, limits, fingerprint, codec) and its
    prepared-context cache (a context is hashed only when that cache is on)."""

    model: Any
    cache: Any


def not_served(name: str | None, names: list[str]) -> RequestError:
    """The refusal of a request naming a model that is not served (400 ``model_unknown``, naming the served ones)."""
    return RequestError("model", f"{name!r} is not served here; the models are: {', '.join(names)}", code=ErrorCode.MODEL_UNKNOWN)


def being_replaced(name: str) -> RequestError:
    """The refusal of a request naming a model ``--swap-mode replace`` is loading (503, retry)."""
    return RequestError("model", f"{name!r} is being replaced (--swap-mode replace: its old revision is freed before the new one "
                        "loads); retry shortly", 503, ErrorCode.UNAVAILABLE)


@dataclass(frozen=True)
class ParseContext:
    """What decoding a request reads of the service: its settings, its uploaded contexts (``uploads``; 0 bytes of them
    refuse contexts named by ref and keep no inline one: a job any replica may score), and the served models
    (a snapshot, the default first; those ``--swap-mode replace`` is loading take no request)."""

    config: ServeConfig
    uploads: Any
    """The ``UploadedContexts`` (``nvrm.serve.batching.contexts``)."""
    models: Mapping[str, ParseTarget]
    names: tuple[str, ...]
    """Every served name, the default first (those being replaced included)."""
    replacing: frozenset[str] = frozenset()
    kept: Callable[[], None] = field(default=lambda: None)
    """Called when an inline context is kept in ``uploads`` (counted)."""

    def target(self, name: str | None = None) -> ParseTarget:
        """The model a request naming ``name`` is decoded by (None: the default); ``RequestError`` if none serves it now."""
        name = self.names[0] if name is None and self.names else name
        if name in self.replacing:
            raise being_replaced(name)  # type: ignore[arg-type]
        if name not in self.models:
            raise not_served(name, list(self.names))
        return self.models[name]  # type: ignore[index]

    @property
    def default(self) -> ParseTarget:
        """The model of a request that names none."""
        return self.target(None)


def named_model(payload: Any) -> str | None:
    """The served model a request body names (``model``), None for the default; ``RequestError`` unless a string."""
    name = payload.get("model") if isinstance(payload, dict) else None
    if name is not None and not isinstance(name, str):
        raise RequestError("request.model", "must be a string (a name from GET /v1/models)")
    return name


def parse_work(ctx: ParseContext, raw: bytes, content_type: str, kind: str) -> Work:
    """Body -> validated request -> media (decoded, confined, keyed), by the model it names. Runs in a worker thread."""
    cpu0 = time.thread_time()
    HASH_SECONDS.value = 0.0
    limits = ctx.default.model.limits
    max_items = min(limits.max_request_items, ctx.config.max_queue_items)
    body = parse_body(raw, content_type, max_items, 2 * limits.max_context_samples)
    target = ctx.target(named_model(body.payload))  # with several served models, the one it names parses it
    model, limits = target.model, target.model.limits
    request = ScoreRequest if kind == "score" else GroupRequest
    listed = body.payload.get("items" if kind == "score" else "candidates") if isinstance(body.payload, dict) else None
    n = len(listed) if isinstance(listed, list) else 0  # counted before validation builds an error per element
    if n <= max_items:
        try:
            req = request.model_validate(body.payload)
        except ValidationError as e:
            raise RequestError(*describe_validation_error(e)) from e
    if n > max_items:
        which = "max_request_items" if limits.max_request_items <= ctx.config.max_queue_items else "max_queue_items"
        raise RequestError("request", f"has {n} items; the limit is {max_items} per request ({which})", code=ErrorCode.TOO_LARGE)

    def media(video, where: str, role: str = "candidate"):
        # only contexts are shared across requests, so only they are hashed
        keyed = role == "context" and target.cache.enabled
        return to_media(video, ctx.config.allow_dirs, where, body.parts, limits, keyed=keyed, role=role, contract=model.contract, uploads=ctx.uploads)

    def context(video, where: str):
        if video is None:  # no context: the model's contract refuses it unless it has the no_context opt-in
            return Media(None, "none")
        m = media(video, where, "context")
        # an inline sampled clip or video bytes is kept under its content hash: later requests (from any
        # client) name it by ref, and share its prepared frames and prefill with this one
        inline = video.times is not None or video.data is not None or (video.part is not None and video.fps is None)
        if inline and ctx.uploads.max_bytes > 0:
            ref = ref_of(m, model.contract.fingerprint)
            held = ctx.uploads.peek(ref)
            if held is None:  # keep a copy that owns its memory (not a view of this request's body)
                held, size = stored(m, ref)
                if ctx.uploads.put(ref, held, size):
                    ctx.kept()
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
    work.model, work.expect_revision, work.fingerprint = req.model, req.expect_revision, model.fingerprint  # type: ignore[union-attr]
    if req.conservative is not None and getattr(model, "guard", None) is None:  # type: ignore[union-attr]
        raise RequestError("request.conservative", f"model {req.model or ctx.names[0]!r} has no guard, so its rewards have no uncertainty "  # type: ignore[union-attr]
                           "to be conservative with; fit one with nvrm guard fit, or drop conservative")
    work.conservative = req.conservative  # type: ignore[union-attr]
    work.hash_seconds = HASH_SECONDS.value
    work.body_bytes = len(raw)
    videos = [(c.value, "context", c.key) for _, c, _ in work.items] + [(d.value, "candidate", "") for _, _, d in work.items] if work.items is not None else (
        [(work.group[1].value, "context", work.group[1].key)] + [(d.value, "candidate", "") for d in work.group[2]]  # type: ignore[index]
    )
    work.prepared_bytes = prepared_bytes(videos, model.contract, limits, model.engine.codec is not None)
    work.cpu_seconds = time.thread_time() - cpu0 - work.hash_seconds
    return work


def parse_upload(ctx: ParseContext, raw: bytes, content_type: str) -> dict[str, Any]:
    """``POST /v1/contexts``: validate, sample-check and keep one context; answer its ref. Runs in a worker thread."""
    model = ctx.default.model
    limits = model.limits
    body = parse_body(raw, content_type, 1)
    try:
        req = ContextUpload.model_validate(body.payload)
    except ValidationError as e:
        raise RequestError(*describe_validation_error(e)) from e
    if req.context.ref is not None or req.context.path is not None:
        raise InputError("context", "upload the content itself: sampled frames (with times and sampled) or encoded video bytes")
    if req.context.times is None and req.context.data is None and (req.context.part is None or req.context.fps is not None):
        raise InputError("context", "frames are uploaded sampled (with times and sampled); read /v1/info for the contract's time plan")
    media = to_media(req.context, (), "context", body.parts, limits, role="context", contract=model.contract)
    ref = ref_of(media, model.contract.fingerprint)
    kept, size = stored(media, ref)
    if ctx.uploads.max_bytes <= 0:
        raise RequestError("context", "context uploads are off on this server (--context-store-mb 0)", code=ErrorCode.FORBIDDEN)
    if not ctx.uploads.put(ref, kept, size):
        raise RequestError("context", f"is {size} bytes, more than the whole context store ({ctx.uploads.max_bytes} bytes, --context-store-mb)",
                           code=ErrorCode.TOO_LARGE)
    return {"ref": ref, "bytes": size}
