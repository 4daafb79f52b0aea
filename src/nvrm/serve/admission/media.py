"""A request's VIDEO objects -> scoring inputs, safely, with a content key for each.

VIDEO is one of
- ``{"path": "..."}``: a file inside an allowed directory (symlinks are
  resolved first, so neither ``..`` nor a link can leave it);
- ``{"data": "<base64>"}``: encoded video bytes;
- ``{"frames": "<base64 .npy>", "fps": F}``: a uint8 ``(T, H, W, 3)`` array;
- ``{"part": "name"[, "fps": F]}``: a multipart part holding the same bytes
  raw (``.npy`` frames when ``fps`` is given, encoded video otherwise);
- frames (``frames`` or a ``.npy`` part) with ``"times": [...]`` and
  ``"sampled": <contract fingerprint>``: frames the client already chose by
  the contract's time plan (``nvrm.video.sampling``), with their source
  times. A fingerprint other than this server's contract is refused (409,
  ``contract_mismatch``), so a client can never sample by another rule;
- ``{"ref": "<hash>"}``: a context uploaded before with ``POST /v1/contexts``,
  named by its content hash (``protocol.context_ref``); unknown -> 409,
  ``context_unknown``, and the client uploads it once.

``.npy`` payloads are parsed from their header and checked against the bytes
actually present before anything is allocated (never ``allow_pickle``); the
frames are a zero-copy view of the request body. Each input gets a content
key (sha256 of its bytes, plus the real path for files) so the service can
recognise a context it has already prepared.
"""

from __future__ import annotations

import ast
import base64
import binascii
import hashlib
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ...clip import Clip
from ...contract import Contract
from ...errors import InputError, RequestError
from ...video.inputs import Sampled
from ...limits import Limits
from ...protocol import ErrorCode, Video, context_ref
from ...video.sampling import SamplePlan

_NPY_MAGIC = b"\x93NUMPY"
_MAX_NPY_HEADER = 65536
# ast.literal_eval is not safe to call from several threads at once in CPython 3.11
# ("AST constructor recursion depth mismatch"); headers are tiny, so parse them one at a time.
_HEADER_LOCK = threading.Lock()


class _Tally(threading.local):
    value = 0.0


HASH_SECONDS = _Tally()
"""CPU seconds this thread spent hashing contexts (the parse thread reads and resets it)."""


@dataclass(frozen=True)
class Media:
    """One decoded VIDEO: what the runtime accepts, and a key that identifies its content."""

    value: Any
    key: str


def _b64(value: str, where: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InputError(where, f"is not valid base64 ({e})") from e


def npy_header(raw: "bytes | memoryview", where: str) -> tuple[str, bool, tuple, int]:
    """(dtype descr, Fortran order, shape, offset of the data) of ``.npy`` bytes, read from the header alone
    (never ``allow_pickle``; an object dtype is refused by its callers' dtype rules)."""
    view = memoryview(raw)
    if len(view) < 10 or bytes(view[:6]) != _NPY_MAGIC:
        raise InputError(where, "is not a .npy array (no NUMPY magic)")
    major = view[6]
    if major == 1:
        hlen, start = int.from_bytes(view[8:10], "little"), 10
    elif major in (2, 3):
        if len(view) < 12:
            raise InputError(where, "is not a .npy array (short header)")
        hlen, start = int.from_bytes(view[8:12], "little"), 12
    else:
        raise InputError(where, f"is not a .npy array (format version {major})")
    if hlen > _MAX_NPY_HEADER or start + hlen > len(view):
        raise InputError(where, "is not a .npy array (bad header length)")
    try:
        with _HEADER_LOCK:
            header = ast.literal_eval(bytes(view[start : start + hlen]).decode("latin1"))
        descr, fortran, shape = header["descr"], header["fortran_order"], tuple(header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError) as e:
        raise InputError(where, "is not a .npy array (unreadable header)") from e
    if not isinstance(descr, str):
        raise InputError(where, f"the .npy declares a structured dtype {str(descr)[:60]}; plain arrays only")
    if not all(type(n) is int and n >= 0 for n in shape):
        raise InputError(where, f"the .npy declares shape {shape}, not whole non-negative numbers")
    return descr, bool(fortran), shape, start + hlen


def load_npy(raw: "bytes | memoryview", where: str, limits: Limits) -> np.ndarray:
    """A uint8 (T, H, W, 3) array from ``.npy`` bytes, as a view; the header is checked before any allocation."""
    view = memoryview(raw)
    try:
        descr, fortran, shape, offset = npy_header(view, where)
    except InputError as e:
        if "shape" in str(e):
            raise InputError(where, f"frames must have shape (T, H, W, 3) of whole numbers; {str(e).split(': ', 1)[-1]}") from e
        raise
    if descr not in ("|u1", "<u1", ">u1", "u1"):
        raise InputError(where, f"frames must be uint8, the .npy declares dtype {descr!r}")
    if fortran:
        raise InputError(where, "frames must be a C-ordered .npy array")
    if len(shape) != 4 or shape[-1] != 3:
        raise InputError(where, f"frames must have shape (T, H, W, 3), the .npy declares {shape}")
    t, h, w, _ = shape
    limits.check_source(w, h, where)
    declared = t * h * w * 3
    body = len(view) - offset
    if declared != body:
        raise InputError(where, f"the .npy declares shape {shape} ({declared} bytes) but carries {body} bytes")
    return np.frombuffer(view, dtype=np.uint8, count=declared, offset=offset).reshape(shape)


def confine_path(raw: str, allow_dirs: tuple[str, ...], where: str) -> str:
    """The real path of ``raw`` if it lies inside an allowed directory."""
    if not raw:
        raise InputError(where, "'path' must be a non-empty string")
    if not allow_dirs:
        raise RequestError(where, "path inputs are disabled on this server (start it with --allow-dir)", code=ErrorCode.FORBIDDEN)
    if "\x00" in raw:
        raise InputError(where, "path contains a NUL byte")
    real = os.path.realpath(raw)
    for d in allow_dirs:
        if os.path.commonpath([real, d]) == d:
            return real
    raise RequestError(f"{where} {raw}", "is outside the allowed directories", code=ErrorCode.FORBIDDEN)


FILE_READ_SECONDS = 30
"""Longest a request's file may take to hash (regular files only; a FIFO or device is refused first)."""


def file_key(path: str, where: str) -> str:
    """A content key for a file: sha256 over the length-prefixed path, then the bytes (no path/content
    pair can collide with another). Only regular files are read: a FIFO or device would block the
    parsing thread (opened non-blocking, checked, then read)."""
    name = path.encode("utf-8", "surrogateescape")
    h = hashlib.sha256(b"nvrm-file-v2\0" + len(name).to_bytes(8, "little") + name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return "missing:" + path  # the engine reports it in the item's slot
    except OSError as e:
        raise InputError(where, f"cannot read ({e.strerror})") from e
    deadline = time.monotonic() + FILE_READ_SECONDS
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(where, "is not a regular file (a FIFO, socket or device); pass a video file")
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            if time.monotonic() > deadline:  # a stalled network mount holds one parsing thread this long at most
                raise InputError(where, f"could not be read within {FILE_READ_SECONDS} s; is it on a stalled mount?")
    return "file:" + h.hexdigest()


def presampled(arr: np.ndarray, times: list[float], sampled: str, role: str, contract: Contract, limits: Limits, label: str) -> Sampled:
    """Frames the client chose by the contract's time plan, checked against this server's contract."""
    if sampled != contract.fingerprint:
        raise RequestError(
            label, f"was sampled under contract {sampled[:12]}, this server runs {contract.fingerprint[:12]}; "
            "read /v1/info and sample again (nvrm's client does this itself)", code=ErrorCode.CONTRACT_MISMATCH,
        )
    n = int(arr.shape[0])
    if len(times) != n:
        raise InputError(label, f"has {n} frames but {len(times)} times")
    if any(not np.isfinite(t) or t < 0 for t in times) or any(b < a for a, b in zip(times, times[1:])):
        raise InputError(label, "times must be finite, >= 0 and non-decreasing")
    limits.check_source(int(arr.shape[2]), int(arr.shape[1]), label)
    if role == "candidate":
        want = contract.candidate_frames
        if n != want and not (contract.short_candidates and 1 <= n < want):
            raise InputError(label, f"a sampled candidate has {want} frames under this contract, not {n}")
    else:
        limits.check_context_duration(times[-1] + 1.0 / contract.sample_fps, label)
        limits.check_context_frames(n, label)
    plan = SamplePlan(tuple(range(n)), tuple(float(t) for t in times), tuple(float(t) for t in times), times[-1] + 1.0 / contract.sample_fps)
    return Sampled(tuple(arr[i] for i in range(n)), plan, label, role)


def to_media(
    video: Video,
    allow_dirs: tuple[str, ...],
    where: str,
    parts: Mapping[str, "bytes | memoryview"],
    limits: Limits,
    *,
    keyed: bool = False,
    role: str = "candidate",
    contract: Contract | None = None,
    uploads=None,
) -> Media:
    """A validated VIDEO as a scoring input, with its content key when ``keyed`` (contexts; "" otherwise).

    ``role`` is the slot it fills; ``contract`` checks pre-sampled frames; ``uploads`` (the ``UploadedContexts``)
    resolves ``ref``s.
    """
    if video.ref is not None:
        if role != "context":
            raise InputError(f"{where}.ref", "only a context can be named by ref")
        held = uploads.get(video.ref) if uploads is not None else None
        if held is None:
            raise RequestError(
                f"{where}.ref {video.ref[:16]}", "is not held by this server (never uploaded, or evicted); upload it with POST /v1/contexts",
                status=409, code=ErrorCode.CONTEXT_UNKNOWN,
            )
        return held

    def key(kind: str, data: "bytes | memoryview", extra: str = "") -> str:
        if not keyed:
            return ""
        t = time.thread_time()
        digest = hashlib.sha256(data).hexdigest()
        HASH_SECONDS.value += time.thread_time() - t
        return f"{kind}:{digest}{extra}"

    if video.path is not None:
        real = confine_path(video.path, allow_dirs, where)
        return Media(real, file_key(real, where) if keyed else "")
    if video.data is not None:
        data = _b64(video.data, f"{where}.data")
        if not data:
            raise InputError(f"{where}.data", "is empty")
        return Media(data, key("bytes", data))
    if video.frames is not None:
        raw: "bytes | memoryview" = _b64(video.frames, f"{where}.frames")
        label = f"{where}.frames"
    else:
        if video.part not in parts:
            raise InputError(f"{where}.part", f"names no part of this request ({video.part!r})")
        raw = parts[video.part]  # type: ignore[index]
        label = f"{where}.part {video.part}"
        if video.fps is None and video.times is None:
            if not len(raw):
                raise InputError(label, "is empty")
            return Media(bytes(raw), key("bytes", raw))
    arr = load_npy(raw, label, limits)
    if video.times is not None:
        value = presampled(arr, video.times, video.sampled, role, contract or Contract(), limits, label)  # type: ignore[arg-type]
        return Media(value, "ref:" + context_ref(video.sampled, frames=arr, times=video.times) if keyed else "")  # type: ignore[arg-type]
    fps = float(video.fps)  # type: ignore[arg-type]
    limits.check_fps(fps, label)
    return Media(Clip(arr, fps, name=label), key("frames", raw, f"|{fps!r}"))


def ref_of(media: Media, fingerprint: str) -> str:
    """The content hash a context is stored under (read from its key when ``to_media`` made one)."""
    if media.key.startswith("ref:"):
        return media.key[4:]
    value = media.value
    if isinstance(value, Sampled):
        return context_ref(fingerprint, frames=np.stack([np.asarray(f) for f in value.frames]), times=value.plan.times)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return context_ref(fingerprint, data=value)
    raise InputError("context", "only sampled frames (with times and sampled) or encoded video bytes can be uploaded")


def stored(media: Media, ref: str) -> tuple[Media, int]:
    """An uploaded context as the store keeps it under ``ref``: (a copy that owns its memory, its bytes)."""
    value = media.value
    if isinstance(value, Sampled):
        frames = np.stack([np.asarray(f) for f in value.frames])  # a copy: the request body is freed
        kept = Sampled(tuple(frames[i] for i in range(len(frames))), value.plan, f"context {ref[:12]}", "context")
        return Media(kept, "ref:" + ref), int(frames.nbytes)
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return Media(data, "ref:" + ref), len(data)
    raise InputError("context", "only sampled frames (with times and sampled) or encoded video bytes can be uploaded")
