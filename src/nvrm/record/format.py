"""The rollout record's layout (pure: paths, keys, rows, the sampling rule; ``writer`` and ``reader`` do the I/O).

A record is one folder::

    DIR/
      record.json                  {"format": "nvrm-record", "version": 1}
      rows/000000000000.jsonl      manifest segments, oldest first; one JSON object per scored item
      contexts/ab/ab12....npy      one context's sampled frames, uint8 (T, H, W, 3), stored once by content hash
      candidates/cd/cd34....npy    one candidate's sampled frames, the same way

Frames are the contract's *sampled* frames (before the per-frame resize and JPEG round trip), so
preparing them again under the same contract gives the very frames the model scored. Files are plain
``.npy`` (never pickle). A row (``row()``) names its files relative to ``DIR``.

Content addressing: a file's key is the sha256 of its frames' shape, dtype and bytes, with the
sample times, so one context sent by a thousand requests is stored once.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

import numpy as np

FORMAT = "nvrm-record"
VERSION = 1
HEADER = "record.json"
ROWS = "rows"
KINDS = ("contexts", "candidates")


def frames_key(frames: np.ndarray, times: Sequence[float]) -> str:
    """The content hash of sampled frames (uint8 ``(T, H, W, 3)``) at ``times`` (pure)."""
    h = hashlib.sha256()
    h.update(f"{frames.dtype.str}|{tuple(frames.shape)}|{','.join(f'{t:.6f}' for t in times)}|".encode())
    h.update(np.ascontiguousarray(frames).data)
    return h.hexdigest()


def frames_path(kind: str, key: str) -> str:
    """Where frames of ``kind`` (``contexts`` or ``candidates``) with content ``key`` live, relative to the record."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return f"{kind}/{key[:2]}/{key}.npy"


def segment_name(seq: int) -> str:
    """The manifest segment file for sequence number ``seq`` (names sort oldest first)."""
    return f"{ROWS}/{seq:012d}.jsonl"


def group_key(source: str, request: int, prompt: str, context_key: str | None) -> str:
    """A request's group: its items that share a prompt and a context (the rule of ``nvrm.source.reward_source.group_items``)."""
    digest = hashlib.sha256(f"{prompt}\x00{context_key or ''}".encode()).hexdigest()[:12]
    return f"{source}-{request}-{digest}"


def sampled(rate: float, seed: int, key: str) -> bool:
    """Whether the item (or group) named ``key`` is recorded at ``rate`` (0..1): deterministic for a seed (pure)."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    draw = int.from_bytes(hashlib.sha256(f"{seed}|{key}".encode()).digest()[:8], "little") / 2.0**64
    return draw < rate


def row(
    *, seq: int, time: float, source: str, group: str, index: int, prompt: str, context: dict | None, candidate: dict,
    reward: float, revision: str, contract: str, extra: dict | None = None,
) -> dict[str, Any]:
    """One manifest row: what was scored (prompt, context, candidate frames), its reward and by which model.

    ``context`` / ``candidate``: ``{"key", "path", "times"}`` (``context`` None: scored without one)."""
    out = {
        "seq": seq, "time": round(time, 3), "source": source, "group": group, "index": index, "prompt": prompt,
        "context": context, "candidate": candidate, "reward": reward, "revision": revision, "contract": contract,
    }
    if extra:
        out.update(extra)
    return out


def frames_ref(kind: str, key: str, times: Sequence[float]) -> dict[str, Any]:
    """A row's reference to stored frames: their key, path and sample times."""
    return {"key": key, "path": frames_path(kind, key), "times": [round(float(t), 6) for t in times]}


def header() -> str:
    """The text of ``record.json``."""
    return json.dumps({"format": FORMAT, "version": VERSION}) + "\n"


def check_header(obj: Any) -> str | None:
    """Why ``record.json``'s content is not a record this nvrm reads (None: it is)."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        return f"is not an nvrm record (record.json lacks format {FORMAT!r})"
    if obj.get("version") != VERSION:
        return f"is record version {obj.get('version')!r}; this nvrm reads version {VERSION}"
    return None


def row_bytes(line: str, files: Sequence[int]) -> int:
    """What a row costs against ``--record-mb``: its manifest line and the files it added."""
    return len(line.encode()) + sum(files)
