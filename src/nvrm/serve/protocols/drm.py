"""verl-omni's HTTP scorer protocols (verl-omni @ a1139baf, ``verl_omni/utils/reward_score/*http_scorer_client.py``) as one router.

verl-omni's safetensors client (``latent_http_scorer_client``) posts one sample per request to its ``server_url``
with ``content-type: application/octet-stream`` and ``x-drm-protocol-version: 1``, and reads back
``{"protocol_version": "1", "raw_scores": [one float]}``. On ``nvrm serve`` that URL is ``http://HOST:PORT/drm/score``:

    POST /drm/score   header x-drm-protocol-version: 1   body: safetensors
        "frames"   uint8 [1, T, H, W, 3] (or [T, H, W, 3])   the candidate video
        "context"  uint8 [1, T, H, W, 3] (optional)           the context video's frames
        __metadata__ {"prompt": ..., "fps": "16", "context_fps": "16" (default fps),
                      "context_path": a file under --allow-dir, or "context_ref": an uploaded context}
      -> {"protocol_version": "1", "raw_scores": [reward], "contract": ..., "model": ...}

The context travels in the body: its frames, or a path / ref in the metadata (a fixed context per
prompt); with none, the 400 says so (unless the contract has the ``no_context`` opt-in). verl-omni's
SD3.5 body (``latents`` and ``prompt_embeds``, an image latent with no prompt text) is refused with
what to send instead. The safetensors header is read and checked against the bytes before any
array is made (dtype, shape, offsets), and the frames are a view of the body. Its pickle client
(``http_scorer_client``: ``pickle.dumps({images, prompts, metadata})``) gets a 415 naming this protocol;
a pickle is never read.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
from fastapi import APIRouter, FastAPI, Request

from ...clip import Clip
from ...errors import RequestError
from ...protocol import INPUT_CODES, ErrorCode, Video
from ...results import item_dict
from ..admission.budget import prepared_bytes
from ..admission.media import Media, to_media
from ..admission.requests import ParseContext, Work
from ..http.messages import Reply
from ..http.routing import ERRORS, pending_body, respond
from ..serving import Scored
from .native import served_by
from .spec import ProtocolSpec, Wire, both_values, handed_out
from .unirl import pickle_refusal, pickled

PROTOCOL_VERSION = "1"
PROTOCOL_HEADER = "x-drm-protocol-version"
MAX_HEADER_BYTES = 1 << 20
"""The most a safetensors JSON header may take (a few tensors' names, shapes and the metadata)."""
_WHERE = "DRM safetensors body"


def safetensors_header(raw: "bytes | memoryview") -> tuple[dict[str, Any], dict[str, str], int]:
    """(tensor name -> {dtype, shape, data_offsets}, the ``__metadata__`` strings, where the data starts), checked
    against the body's length; no array is made."""
    view = memoryview(raw)
    if len(view) < 8:
        raise RequestError(_WHERE, "is shorter than a safetensors header (8 bytes of length, then JSON)")
    n = int.from_bytes(view[:8], "little")
    if n > MAX_HEADER_BYTES or 8 + n > len(view):
        raise RequestError(_WHERE, f"declares a {n}-byte header; the body holds {len(view) - 8} bytes after the length "
                           f"(the limit is {MAX_HEADER_BYTES})")
    try:
        header = json.loads(bytes(view[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise RequestError(_WHERE, "has a header that is not JSON; is it safetensors?") from e
    except ValueError as e:  # an integer of more digits than Python converts (4300): no shape or offset is that long
        raise RequestError(_WHERE, "has a header holding an integer of thousands of digits; no shape or offset is that long") from e
    if not isinstance(header, dict):
        raise RequestError(_WHERE, "has a header that is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise RequestError(f"{_WHERE} __metadata__", "must map strings to strings")
    data = len(view) - 8 - n
    for name, t in header.items():
        ok = isinstance(t, dict) and isinstance(t.get("dtype"), str) and all(isinstance(t.get(k), list) for k in ("shape", "data_offsets"))
        shape, offsets = (t.get("shape"), t.get("data_offsets")) if ok else ([], [])
        if not ok or not all(type(d) is int and d >= 0 for d in shape) or len(offsets) != 2 or not all(type(o) is int for o in offsets):
            raise RequestError(f"{_WHERE} tensor {name[:40]!r}", "has no usable dtype, shape and data_offsets")
        begin, end = offsets
        if not 0 <= begin <= end <= data:
            raise RequestError(f"{_WHERE} tensor {name[:40]!r}", f"lies at bytes {begin}..{end} of a {data}-byte data section")
    return header, meta, 8 + n


def _frames(raw: memoryview, entry: dict, start: int, name: str, limits) -> np.ndarray:
    """Tensor ``name`` as uint8 frames [T, H, W, 3], a view of the body."""
    where = f"{_WHERE} tensor {name!r}"
    shape = list(entry["shape"])
    if entry["dtype"] != "U8":
        raise RequestError(where, f"must be uint8 frames (dtype U8), the header declares {entry['dtype']}")
    if len(shape) == 5 and shape[0] == 1:
        shape = shape[1:]
    if len(shape) != 4 or shape[-1] != 3:
        raise RequestError(where, f"must have shape [1, T, H, W, 3] or [T, H, W, 3], the header declares {entry['shape']}")
    limits.check_source(shape[2], shape[1], where)
    begin, end = entry["data_offsets"]
    if end - begin != math.prod(shape):
        raise RequestError(where, f"declares shape {entry['shape']} ({math.prod(shape)} bytes) but spans {end - begin} bytes")
    return np.frombuffer(raw, dtype=np.uint8, count=math.prod(shape), offset=start + begin).reshape(shape)


def _fps(meta: dict[str, str], key: str, default: str | None, limits) -> float:
    text = meta.get(key, default)
    if text is None:
        raise RequestError(f"{_WHERE} __metadata__", f"needs {key!r}: the frames' rate (a number as a string)")
    try:
        fps = float(text)
    except ValueError as e:
        raise RequestError(f"{_WHERE} __metadata__[{key!r}]", f"is {text[:40]!r}, not a number") from e
    limits.check_fps(fps, f"{_WHERE} __metadata__[{key!r}]")
    return fps


def decode_drm(ctx: ParseContext, raw: bytes, version: str | None) -> Work:
    """A DRM safetensors body (``version``: its protocol header) as one scoring item (the candidate's frames, its context,
    its prompt), by the default model. Runs in a worker thread."""
    if pickled(raw) or version is None:  # verl-omni's pickle client sends no protocol header
        if pickled(raw):
            raise pickle_refusal("DRM scorer body")
        raise RequestError("DRM scorer body", f"no {PROTOCOL_HEADER} header; this route reads the safetensors protocol ({PROTOCOL_HEADER}: "
                           f"{PROTOCOL_VERSION}, a safetensors body; docs/serving.md)", code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)
    if version != PROTOCOL_VERSION:
        raise RequestError(f"header {PROTOCOL_HEADER}", f"is {version[:16]!r}; this server speaks version {PROTOCOL_VERSION}")
    model = ctx.default.model
    limits, contract = model.limits, model.contract
    tensors, meta, start = safetensors_header(raw)
    if "frames" not in tensors:
        sd35 = "latents" in tensors or "prompt_embeds" in tensors
        what = ("carries SD3.5 image latents and prompt embeddings (verl-omni's DRM body); nvrm scores video against its prompt text"
                if sd35 else f"holds {sorted(tensors)[:8]}, no 'frames'")
        raise RequestError(_WHERE, what + "; send 'frames' (uint8 [1, T, H, W, 3]) with __metadata__ prompt and fps")
    prompt = meta.get("prompt")
    if prompt is None:
        raise RequestError(f"{_WHERE} __metadata__", "needs 'prompt': the text the video was generated from")
    view = memoryview(raw)
    fps = _fps(meta, "fps", None, limits)
    candidate = Media(Clip(_frames(view, tensors["frames"], start, "frames", limits), fps, name="frames"), "")
    given = [k for k in ("context", "context_path", "context_ref") if k in tensors or k in meta]
    if len(given) > 1:
        raise RequestError(_WHERE, f"names {len(given)} contexts ({', '.join(given)}); send one")
    if not given:
        if not contract.no_context:
            raise RequestError(_WHERE, "has no context video: send a 'context' tensor, or __metadata__ context_path "
                               "(under --allow-dir) or context_ref")
        context = Media(None, "none")
    elif given[0] == "context":
        arr = _frames(view, tensors["context"], start, "context", limits)
        cfps = _fps(meta, "context_fps", meta.get("fps"), limits)
        key = hashlib.sha256(f"drm|{arr.shape}|{cfps!r}|".encode() + arr.tobytes()).hexdigest()
        context = Media(Clip(arr, cfps, name="context"), "frames:" + key)
    else:
        video = Video(path=meta["context_path"]) if given[0] == "context_path" else Video(ref=meta["context_ref"])
        context = to_media(video, ctx.config.allow_dirs, f"{_WHERE} __metadata__[{given[0]!r}]", {}, limits, keyed=True, role="context",
                           contract=contract, uploads=ctx.uploads)
    work = Work("score", False, items=[(prompt, context, candidate)])
    work.body_bytes = len(raw)
    work.prepared_bytes = prepared_bytes([(context.value, "context", context.key), (candidate.value, "candidate", "")], contract, limits,
                                         model.engine.codec is not None)
    return work


class DrmProtocol(ProtocolSpec[Work]):
    """verl-omni's scorer route, ``/drm/score`` (its ``server_url``): one sample's raw reward."""

    name = "verl-omni DRM"
    protected = ("/drm/",)

    def decode(self, ctx: ParseContext, wire: Wire) -> Work:
        """The safetensors body as one item (``decode_drm``)."""
        return decode_drm(ctx, wire.raw, wire.headers.get(PROTOCOL_HEADER))

    def encode(self, decoded: Work, outcome: Scored) -> Reply:
        """``{"protocol_version", "raw_scores": [reward], ...}``, or the item's error (422 for its input's fault, else 500)."""
        [result] = outcome.results
        if isinstance(result, BaseException):
            error = item_dict(result)["error"]
            return Reply(422 if error["code"] in INPUT_CODES else 500, {"error": error})
        e = outcome.entry
        weight = self.serving.config.conservative
        return Reply(200, {"protocol_version": PROTOCOL_VERSION, "raw_scores": [handed_out(result, weight)], "contract": e.fingerprint,
                           "model": served_by(e), **both_values(result), **({"conservative": weight} if weight is not None else {}),
                           **({"off_contract": list(result.off_contract)} if result.off_contract else {})},
                     {PROTOCOL_HEADER: PROTOCOL_VERSION})

    def attach_router(self, app: FastAPI) -> None:
        """``POST /drm/score``."""
        router = APIRouter(prefix="/drm")
        config = self.serving.config

        @router.post("/score", summary="verl-omni: one sample's reward over the safetensors protocol (x-drm-protocol-version: 1)",
                     responses={**ERRORS, 422: {"description": "the sample could not be scored (its one-line reason)"}})
        async def drm_score_route(request: Request):
            return respond(await self.answer(pending_body(request, config), "DRM scorer body"))

        app.include_router(router)
