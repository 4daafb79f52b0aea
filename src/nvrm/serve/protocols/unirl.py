"""UniRL's reward-service protocol (``unirl`` 0.2.0, ``unirl.reward.remote.RemoteRewardBackend``) as one router.

UniRL's client is configured with ``base_url``; it calls ``GET {base_url}/health`` and ``POST {base_url}/score``.
On ``nvrm serve`` the base URL is ``http://HOST:PORT/unirl``:

    POST /unirl/score {"protocol_version": "1", "requests": [{"history": [{"text", "video_b64" | "video_path" | "image_b64"}, ...],
                       "required_rewards": ["nvrm"], "metadata": {...} | null, "request_id", "sample_id", "group_id", ...}]}
      -> {"protocol_version": "1", "results": [{"nvrm": {"reward": r}} | {}], "errors": [{} | {"nvrm": "one line"}],
          "identities": [the request's identity fields, "scorer_version": this server's contract fingerprint]}
    GET /unirl/health -> {"status": "ok", "rewards": {"nvrm": ["reward"]}}   (503 while the model loads)

The candidate is the last history entry (its ``text`` is the prompt). UniRL has no field for a context
video, so it travels one of two ways, checked in this order:
- ``metadata["nvrm_context"]``: an nvrm VIDEO object (``{"path"}`` under ``--allow-dir``, ``{"data"}``
  base64 video or image bytes, ``{"ref"}`` of an uploaded context): a fixed context per prompt, from the dataset;
- a leading history entry (``video_b64``, ``video_path`` or ``image_b64``): UniRL's own way of sending an
  image-conditioned sample's condition image, which becomes an image context.
With neither, the item's error says so (unless the contract has the ``no_context`` opt-in). Every item is
checked alone: a bad one gets its error in its slot and the others are scored; the whole request gets that
error's status only when no item is left to score. A pickle body gets 415.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from ...errors import InputError, RequestError
from ...protocol import ErrorCode, ErrorResponse
from ...results import one_line
from ..admission.requests import ParseContext, Work, parse_work
from ..http.messages import Reply
from ..http.request_bodies import parse_json
from ..http.routing import ERRORS, pending_body, respond
from ..serving import Scored
from .spec import ProtocolSpec, Wire, both_values, handed_out

PROTOCOL_VERSION = "1"
REWARD_NAME = "nvrm"
"""The reward name this server serves (UniRL's ``required_rewards``)."""
CONTEXT_KEY = "nvrm_context"
"""The metadata key that carries an item's context (an nvrm VIDEO object)."""
IDENTITY_KEYS = ("request_id", "sample_id", "group_id", "source_rank", "policy_version", "idempotency_key")
_MEDIA = {"video_b64": "data", "image_b64": "data", "video_path": "path"}


def pickled(raw: bytes) -> bool:
    """Whether ``raw`` starts like a pickle (protocol 2 and later begin with the PROTO opcode, 0x80) and not like
    safetensors: a safetensors body starts with its header's length (8 bytes, little-endian), whose low byte is 0x80
    for one header length in 256, then the JSON header (``{``) within the body. A pickle's first 8 bytes, read so,
    declare a length beyond any body (protocol 4's FRAME opcode, 0x95, is its third byte)."""
    if raw[:1] != b"\x80":
        return False
    n = int.from_bytes(raw[:8], "little")
    return not (len(raw) >= 9 and 8 + n <= len(raw) and raw[8:9] == b"{")


def pickle_refusal(where: str) -> RequestError:
    """The 415 a pickle body gets: nvrm never unpickles a request."""
    return RequestError(where, "a pickle body is never read; send JSON here, or use the safetensors protocol (POST /drm/score with "
                        "header x-drm-protocol-version: 1; docs/serving.md)", code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)


def _video(entry: Any, where: str) -> dict[str, str]:
    """A history entry's media as an nvrm VIDEO object."""
    if not isinstance(entry, dict):
        raise InputError(where, "must be an object with text and video_b64, video_path or image_b64")
    found = [k for k in _MEDIA if entry.get(k) is not None]
    if len(found) != 1:
        raise InputError(where, f"must hold exactly one of video_b64, video_path, image_b64 (found {found or 'none'})")
    value = entry[found[0]]
    if not isinstance(value, str):
        raise InputError(f"{where}.{found[0]}", "must be a string")
    return {_MEDIA[found[0]]: value}


def to_item(req: Any, where: str, no_context: bool) -> dict[str, Any]:
    """One UniRL request as an nvrm ``/v1/score`` item (prompt, context, candidate), or an ``InputError`` naming what is wrong."""
    if not isinstance(req, dict):
        raise InputError(where, "must be an object with history and required_rewards")
    history = req.get("history")
    if not isinstance(history, list) or not 1 <= len(history) <= 2:
        raise InputError(f"{where}.history", "must list the candidate, after at most one context entry")
    last = f"{where}.history[{len(history) - 1}]"
    candidate = _video(history[-1], last)
    if history[-1].get("image_b64") is not None:
        raise InputError(last, "is a still image; nvrm scores a 5 s video continuation (send video_b64 or video_path)")
    prompt = history[-1].get("text", "")
    if not isinstance(prompt, str):
        raise InputError(f"{last}.text", "must be a string (the prompt)")
    meta = req.get("metadata") if isinstance(req.get("metadata"), dict) else {}
    context = meta.get(CONTEXT_KEY)
    if context is not None and len(history) == 2:
        raise InputError(where, f"has two contexts (metadata[{CONTEXT_KEY!r}] and a leading history entry); send one")
    if context is None and len(history) == 2:
        context = _video(history[0], f"{where}.history[0]")
    if context is not None and not isinstance(context, dict):
        raise InputError(f"{where}.metadata[{CONTEXT_KEY!r}]", 'must be an nvrm VIDEO object ({"path"}, {"data"} or {"ref"})')
    if context is None and not no_context:
        raise InputError(where, f"has no context video; UniRL sends none with a video: give it as metadata[{CONTEXT_KEY!r}] "
                         '({"path": ...} under --allow-dir, {"data": base64}, or {"ref": ...}) or as a leading history entry')
    return {"prompt": prompt, "context": context, "candidate": candidate}


def _identity(req: Any, fingerprint: str) -> dict[str, Any]:
    got = req if isinstance(req, dict) else {}
    return {**{k: got.get(k) for k in IDENTITY_KEYS}, "scorer_version": fingerprint}


@dataclass
class UniRLBatch:
    """A decoded UniRL body: its requests, their items merged into one ``Work``, the request index of each scored item,
    and the requests refused and why."""

    requests: list[Any]
    work: Work
    scored: list[int]
    refused: dict[int, InputError]
    fingerprint: str
    """The contract fingerprint of the model that decoded it (UniRL's ``scorer_version``)."""


def decode_batch(ctx: ParseContext, raw: bytes) -> UniRLBatch:
    """A UniRL body as one ``UniRLBatch``. Each item is decoded alone by ``parse_work`` (paths confined, contexts keyed), so
    one bad item refuses only itself; a pickle is refused (415) before anything is read."""
    if pickled(raw):
        raise pickle_refusal("UniRL score body")
    model = ctx.default.model
    limits = model.limits
    payload = parse_json(raw, limits.max_request_items, "UniRL score body")
    reqs = payload.get("requests") if isinstance(payload, dict) else None
    if not isinstance(reqs, list) or not reqs:
        raise RequestError("UniRL score body", "must be an object with a non-empty 'requests' list")
    if len(reqs) > limits.max_request_items:
        raise RequestError("UniRL score body", f"has {len(reqs)} requests; the limit is {limits.max_request_items}",
                           code=ErrorCode.TOO_LARGE)
    merged, scored, refused = Work("score", False, items=[]), [], {}
    for i, req in enumerate(reqs):
        where = f"requests[{i}]"
        try:
            wanted = req.get("required_rewards") if isinstance(req, dict) else None
            if not isinstance(wanted, list) or REWARD_NAME not in wanted:
                raise InputError(f"{where}.required_rewards", f"must name {REWARD_NAME!r}, the reward this server serves")
            item = to_item(req, where, model.contract.no_context)
            one = parse_work(ctx, json.dumps({"items": [item]}).encode(), "application/json", "score")
        except InputError as e:
            refused[i] = e
            continue
        merged.items.extend(one.items)  # type: ignore[union-attr]
        merged.prepared_bytes += one.prepared_bytes
        merged.cpu_seconds += one.cpu_seconds
        merged.hash_seconds += one.hash_seconds
        scored.append(i)
    merged.body_bytes = len(raw)
    return UniRLBatch(reqs, merged, scored, refused, model.fingerprint)


def answer(reqs: list[Any], scored: list[int], results: list[Any], refused: dict[int, InputError], fingerprint: str,
           conservative: float | None = None) -> dict[str, Any]:
    """UniRL's ``ScoreResponse``: per request its ``{"nvrm": {"reward"}}`` (the conservative reward under ``--conservative``,
    with the raw one and the uncertainty beside it when the model has a guard) or its error (``results``: the scored items'
    ``ScoreResult`` or error, in ``scored``'s order), and its identity echoed."""
    out: list[dict] = [{} for _ in reqs]
    errors: list[dict] = [{} for _ in reqs]
    for i, e in refused.items():
        errors[i] = {REWARD_NAME: one_line(e)}
    for i, r in zip(scored, results):
        if isinstance(r, BaseException):
            errors[i] = {REWARD_NAME: one_line(r)}
        else:
            out[i] = {REWARD_NAME: {"reward": handed_out(r, conservative), **both_values(r)}}
    for i, req in enumerate(reqs):
        wanted = req.get("required_rewards") if isinstance(req, dict) else None
        other = [n for n in wanted if n != REWARD_NAME] if isinstance(wanted, list) else []  # a non-list was refused in decode_batch
        errors[i].update({str(n): f"not served by this server (it serves {REWARD_NAME!r})" for n in other})
    return {"protocol_version": PROTOCOL_VERSION, "results": out, "errors": errors, "identities": [_identity(r, fingerprint) for r in reqs]}


class UniRLProtocol(ProtocolSpec[UniRLBatch]):
    """UniRL's ``/unirl/score`` and ``/unirl/health`` (UniRL's ``base_url`` is ``http://HOST:PORT/unirl``)."""

    name = "UniRL"
    protected = ("/unirl/",)

    def decode(self, ctx: ParseContext, wire: Wire) -> UniRLBatch:
        """The body's requests, each item decoded alone (``decode_batch``)."""
        return decode_batch(ctx, wire.raw)

    def work_of(self, decoded: UniRLBatch) -> Work | None:
        """The scored items' work; None when every request was refused."""
        return decoded.work if decoded.scored else None

    def encode(self, decoded: UniRLBatch, outcome: Scored | None) -> Reply:
        """Every request's reward or error (200); with nothing scored, the first refusal's status (400, 403 for a path
        outside --allow-dir, 409) and its error beside the per-request answer."""
        b = decoded
        if outcome is None:
            first = b.refused[min(b.refused)]
            status = first.status if isinstance(first, RequestError) else 400
            code = first.code if isinstance(first, RequestError) else ErrorCode.BAD_REQUEST
            return Reply(status, {**Reply.error(code, one_line(first)).body, **answer(b.requests, [], [], b.refused, b.fingerprint)})
        return Reply(200, answer(b.requests, b.scored, outcome.results, b.refused, b.fingerprint, self.serving.config.conservative))

    def health(self) -> Reply:
        """``GET /unirl/health``: the rewards served, once the model is loaded (503 before)."""
        return self.serving.not_ready() or Reply(200, {"status": "ok", "protocol_version": PROTOCOL_VERSION,
                                                       "rewards": {REWARD_NAME: ["reward"]}})

    def attach_router(self, app: FastAPI) -> None:
        """``/unirl/score`` and ``/unirl/health``."""
        router = APIRouter(prefix="/unirl")
        config = self.serving.config

        @router.post("/score", summary="UniRL: score requests [{history, required_rewards}] -> {results, errors}", responses=ERRORS)
        async def unirl_score_route(request: Request):
            return respond(await self.answer(pending_body(request, config), "UniRL score body"))

        @router.get("/health", summary="UniRL: the rewards this server serves (503 while loading)", responses={503: {"model": ErrorResponse}})
        async def unirl_health_route():
            return respond(self.health())

        app.include_router(router)
