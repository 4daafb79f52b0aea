"""Manifest rows for ``nvrm batch``: parsing and validation, no I/O beyond reading lines.

One JSON object per line, either a single candidate::

    {"id": "clip-1", "prompt": "...", "context": "ctx.mp4", "candidate": "a.mp4"}

or a group sharing one context (scored with shared-context reuse)::

    {"id": "step-7", "prompt": "...", "context": "ctx.mp4", "candidates": ["a.mp4", "b.mp4"]}

Relative paths resolve against the manifest's folder. Every (id, candidate
index) is one output row; a line that cannot be used still yields its rows,
as errors, so nothing is silently dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import InputError
from ..video.paths import resolve_path

Key = tuple[str, int]


@dataclass(frozen=True)
class ManifestRow:
    """A usable manifest line."""

    line: int
    id: str
    prompt: str
    context: str
    """Resolved path of the context video."""
    candidates: tuple[str, ...]
    """Resolved candidate paths; one for a single-candidate row."""
    labels: tuple[str, ...]
    """Candidate paths as written in the manifest (reported in the output)."""
    group: bool
    """Whether the line used ``candidates`` (a group)."""
    input_keys: tuple[str, ...] = ()
    """Each row's ``input_key`` when already worked out (a Ray task, whose inputs are prepared videos by then)."""

    def keys(self) -> list[Key]:
        return [(self.id, i) for i in range(len(self.candidates))]

    def input_key(self, index: int) -> str:
        """What row ``index`` scores: its prompt, context and candidate, and the two files' size and mtime."""
        if self.input_keys:
            return self.input_keys[index]
        return _digest("row", self.prompt, _identity(self.context), _identity(self.candidates[index]))


@dataclass(frozen=True)
class RowProblem:
    """A manifest line that cannot be scored: it still gets output rows, as errors."""

    line: int
    id: str
    n_candidates: int
    labels: tuple[str, ...]
    message: str

    def keys(self) -> list[Key]:
        return [(self.id, i) for i in range(self.n_candidates)]

    def input_key(self, index: int) -> str:
        return _digest("problem", self.message, self.labels[index] if index < len(self.labels) else "")


def _identity(path: str) -> str:
    """A file as a row's content: its path with its size and modification time (not its bytes: thousands of clips are stat'ed, not read)."""
    try:
        st = os.stat(path)
        return f"{path}|{st.st_size}|{st.st_mtime_ns}"
    except OSError:
        return f"{path}|missing"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class Unit:
    """Work left for one manifest line: the candidate indices missing from the output."""

    row: ManifestRow | RowProblem
    indices: tuple[int, ...]


def parse_line(text: str, line: int, base: Path) -> ManifestRow | RowProblem:
    """Turn one manifest line into a row or a problem that still names its rows."""
    fallback_id = f"line:{line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return RowProblem(line, fallback_id, 1, ("",), f"manifest line {line}: not valid JSON ({e.msg})")
    if not isinstance(obj, dict):
        return RowProblem(line, fallback_id, 1, ("",), f"manifest line {line}: expected a JSON object")
    raw_id = obj.get("id")
    rid = str(raw_id) if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) and str(raw_id) else fallback_id
    group = "candidates" in obj
    cands = obj.get("candidates") if group else [obj.get("candidate")]
    labels = tuple(c if isinstance(c, str) else "" for c in cands) if isinstance(cands, list) and cands else ("",)
    problems = []
    if rid == fallback_id:
        problems.append("'id' must be a non-empty string or integer")
    if group and "candidate" in obj:
        problems.append("give 'candidate' or 'candidates', not both")
    if not isinstance(obj.get("prompt"), str):
        problems.append("'prompt' must be a string")
    if group and (not isinstance(cands, list) or not cands):
        problems.append("'candidates' must be a non-empty list of paths")
    try:
        context = resolve_path(base, obj.get("context"), "'context'")
    except ValueError as e:
        problems.append(str(e))
        context = ""
    resolved: list[str] = []
    for i, c in enumerate(cands if isinstance(cands, list) else []):
        try:
            resolved.append(resolve_path(base, c, f"'candidates[{i}]'" if group else "'candidate'"))
        except ValueError as e:
            problems.append(str(e))
    if problems:
        return RowProblem(line, rid, len(labels), labels, f"manifest line {line}: {'; '.join(problems)}")
    return ManifestRow(line, rid, obj["prompt"], context, tuple(resolved), labels, group)


def iter_manifest(path: Path) -> Iterator[ManifestRow | RowProblem]:
    """Rows of a manifest file in order; blank lines are skipped, a line that is not UTF-8 is a problem row."""
    base = path.parent
    try:
        handle = path.open("rb")
    except FileNotFoundError as e:
        raise InputError(str(path), "manifest not found") from e
    except OSError as e:
        raise InputError(str(path), f"cannot read manifest ({e.strerror})") from e
    with handle:
        for n, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield RowProblem(n, f"line:{n}", 1, ("",), f"manifest line {n}: not UTF-8 text ({e.reason} at byte {e.start})")
                continue
            if text.strip():
                yield parse_line(text, n, base)


def read_manifest(path: str | Path) -> list[ManifestRow | RowProblem]:
    """All rows; refuses a manifest whose ids repeat (their output rows would collide)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(str(path), "is a directory, not a manifest file")
    rows = list(iter_manifest(path))
    seen: dict[str, int] = {}
    for r in rows:
        if r.id in seen:
            raise InputError(
                str(path), f"id {r.id!r} appears on lines {seen[r.id]} and {r.line}; ids must be unique"
            )
        seen[r.id] = r.line
    return rows


@dataclass(frozen=True)
class Staleness:
    """Rows of an existing output that no longer match the manifest (``--resume``)."""

    changed: tuple[Key, ...]
    """The manifest row's prompt, context or candidate (or a file's size or mtime) differs: scored again."""
    removed: tuple[Key, ...]
    """No such (id, candidate index) in the manifest any more: dropped from the output."""

    @property
    def keys(self) -> set[Key]:
        return set(self.changed) | set(self.removed)

    def lines(self) -> list[str]:
        """What resume does about them, for the user (empty when nothing is stale)."""
        def names(keys: tuple[Key, ...]) -> str:
            shown = ", ".join(f"{i}[{k}]" for i, k in keys[:8])
            return shown + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")

        out = []
        if self.changed:
            out.append(f"{len(self.changed)} row(s) changed in the manifest since they were scored, scored again: {names(self.changed)}")
        if self.removed:
            out.append(f"{len(self.removed)} row(s) no longer in the manifest, removed from the output: {names(self.removed)}")
        return out


def stale(rows: list[ManifestRow | RowProblem], existing: list[dict]) -> Staleness:
    """Which ``existing`` output rows the manifest no longer describes. Rows written before outputs had an
    ``input_key`` are compared by their candidate as written."""
    by_id = {r.id: r for r in rows}
    changed, removed = [], []
    for out in existing:
        key = (str(out["id"]), int(out["candidate_index"]))
        row = by_id.get(key[0])
        if row is None or not 0 <= key[1] < len(row.keys()):
            removed.append(key)
        elif out.get("input_key") is not None:
            if out["input_key"] != row.input_key(key[1]):
                changed.append(key)
        elif key[1] < len(row.labels) and out.get("candidate") not in (None, row.labels[key[1]]):
            changed.append(key)
    return Staleness(tuple(changed), tuple(removed))


def pending(rows: list[ManifestRow | RowProblem], done: set[Key]) -> tuple[list[Unit], int]:
    """Work left after ``done`` (in manifest order) and how many keys it skips."""
    units: list[Unit] = []
    skipped = 0
    for r in rows:
        keys = r.keys()
        left = tuple(i for i, k in enumerate(keys) if k not in done)
        skipped += len(keys) - len(left)
        if left:
            units.append(Unit(r, left))
    return units, skipped
