"""Turn a request's VIDEO objects into scoring inputs, safely.

VIDEO is one of
- ``{"path": "..."}``: a file inside an allowed directory (symlinks are
  resolved first, so neither ``..`` nor a link can leave it);
- ``{"data": "<base64>"}``: encoded video bytes;
- ``{"frames": "<base64 .npy>", "fps": F}``: a uint8 ``(T, H, W, 3)`` array
  saved with ``numpy.save`` (loaded with ``allow_pickle=False``).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
from typing import Any

import numpy as np

from ..errors import InputError
from ..inputs import Clip


class RequestError(InputError):
    """The request itself is malformed (HTTP 400 / 403 / 413)."""

    def __init__(self, where: str, reason: str, status: int = 400, code: str = "bad_request"):
        super().__init__(where, reason)
        self.status = status
        self.code = code


def _b64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise InputError(where, "must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InputError(where, f"is not valid base64 ({e})") from e


def resolve_path(raw: Any, allow_dirs: tuple[str, ...], where: str) -> str:
    """The real path of ``raw`` if it lies inside an allowed directory."""
    if not isinstance(raw, str) or not raw:
        raise InputError(where, "'path' must be a non-empty string")
    if not allow_dirs:
        raise RequestError(where, "path inputs are disabled on this server (start it with --allow-dir)", 403, "forbidden")
    if "\x00" in raw:
        raise InputError(where, "path contains a NUL byte")
    real = os.path.realpath(raw)
    for d in allow_dirs:
        if os.path.commonpath([real, d]) == d:
            return real
    raise RequestError(f"{where} {raw}", "is outside the allowed directories", 403, "forbidden")


def to_input(video: Any, allow_dirs: tuple[str, ...], where: str):
    """A request VIDEO object as something ``prepare_input`` accepts."""
    if not isinstance(video, dict):
        raise InputError(where, 'must be an object: {"path": ...}, {"data": ...} or {"frames": ..., "fps": ...}')
    kinds = [k for k in ("path", "data", "frames") if k in video]
    if len(kinds) != 1:
        raise InputError(where, "needs exactly one of 'path', 'data' or 'frames'")
    kind = kinds[0]
    if kind == "path":
        return resolve_path(video["path"], allow_dirs, where)
    if kind == "data":
        data = _b64(video["data"], f"{where}.data")
        if not data:
            raise InputError(f"{where}.data", "is empty")
        return data
    raw = _b64(video["frames"], f"{where}.frames")
    try:
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"{where}.frames", f"is not a .npy array ({' '.join(str(e).split())})") from e
    if not isinstance(arr, np.ndarray):
        raise InputError(f"{where}.frames", "is not a single .npy array")
    fps = video.get("fps")
    if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not math.isfinite(fps) or fps <= 0:
        raise InputError(f"{where}.fps", f"must be a positive number, got {fps!r}")
    return Clip(arr, float(fps), name=f"{where}.frames")


def encode_frames(frames: np.ndarray) -> str:
    """Client side: a uint8 (T, H, W, 3) array as base64 .npy."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(frames), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")
