"""Reading a record back: its rows, their groups and the frames they name (``nvrm prefs pairs --from-record`` makes
rollouts of them: ``nvrm.prefs.pairing.record_rollouts``).

A row is used only when it is whole (``row_problem``): a prompt, a finite numeric reward, and frame references
whose keys are sha256 digests and whose paths stay inside the record folder (no absolute path, no ``..``, no
symlink leading out). Any other row is skipped and counted; ``skipped_rows`` says how many, and why, in one line.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import numpy as np

from ..errors import InputError
from . import format as fmt


def open_record(root: str | Path) -> Path:
    """The record folder ``root``, checked (an ``InputError`` naming it otherwise)."""
    root = Path(root)
    head = root / fmt.HEADER
    try:
        obj = json.loads(head.read_text())
    except FileNotFoundError as e:
        raise InputError(str(root), f"is not an nvrm record (no {fmt.HEADER}); write one with nvrm serve --record") from e
    except (OSError, ValueError) as e:
        raise InputError(str(root), f"cannot read {fmt.HEADER} ({e})") from e
    problem = fmt.check_header(obj)
    if problem:
        raise InputError(str(root), problem)
    return root


_KEY = re.compile(r"[0-9a-f]{64}")


def inside(root: Path, rel: Any) -> Path | None:
    """``root / rel`` when ``rel`` is a relative path that stays inside ``root`` (symlinks resolved), else None."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return None
    parts = PurePosixPath(rel)
    if parts.is_absolute() or ".." in parts.parts:
        return None
    base = root.resolve()
    try:
        (base / rel).resolve().relative_to(base)
    except (ValueError, OSError, RuntimeError):  # leads out (a symlink), or a symlink loop
        return None
    return base / rel


def _ref_problem(root: Path, name: str, ref: Any) -> str | None:
    if not isinstance(ref, dict):
        return f"'{name}' is not a frames reference"
    if not isinstance(ref.get("key"), str) or not _KEY.fullmatch(ref["key"]):
        return f"'{name}' key is not a sha256 digest"
    if inside(root, ref.get("path")) is None:
        return f"'{name}' path is not inside the record folder"
    times = ref.get("times")
    if not isinstance(times, list) or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) for t in times):
        return f"'{name}' times are not a list of finite numbers"
    return None


def row_problem(root: Path, obj: Any) -> str | None:
    """Why a manifest row cannot be used (None: it can), in a few words that are the same for every such row (pure
    but for resolving its paths' symlinks)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("candidate"), dict) or not isinstance(obj.get("group"), str):
        return "not a record row"
    if not isinstance(obj.get("prompt"), str):
        return "no prompt (or not text)"
    reward = obj.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return "a reward that is not a number"
    if not math.isfinite(reward):
        return "a NaN or infinite reward"
    if obj.get("context") is not None and (why := _ref_problem(root, "context", obj["context"])):
        return why
    return _ref_problem(root, "candidate", obj["candidate"])


def read_rows(root: str | Path) -> tuple[list[dict], list[str]]:
    """(the usable rows, oldest first; one message per line that is not one, ``SEGMENT line N: why``) of the record at ``root``."""
    root = open_record(root)
    rows, problems = [], []
    for seg in sorted((root / fmt.ROWS).glob("*.jsonl")):
        for n, line in enumerate(seg.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                problems.append(f"{seg.name} line {n}: not valid JSON")
                continue
            why = row_problem(root, obj)
            if why:
                problems.append(f"{seg.name} line {n}: {why}")
            else:
                rows.append(obj)
    return rows, problems


def skipped_rows(problems: list[str], used: int) -> str | None:
    """One line for the rows ``read_rows`` skipped: how many, why (counted by reason), and the first one; None for none."""
    if not problems:
        return None
    reasons = Counter(p.split(": ", 1)[-1] for p in problems)
    why = "; ".join(f"{k}: {n}" for k, n in reasons.most_common())
    return f"{len(problems)} of {len(problems) + used} record rows that cannot be used ({why}; the first: {problems[0].split(': ', 1)[0]})"


def load_frames(root: str | Path, ref: dict) -> np.ndarray:
    """The uint8 ``(T, H, W, 3)`` frames a row's reference names (never unpickled; never outside the record folder)."""
    path = inside(Path(root), ref.get("path") if isinstance(ref, dict) else None)
    if path is None:
        raise InputError(str(root), f"a row names frames at {str(ref.get('path') if isinstance(ref, dict) else ref)[:200]!r}, outside the record folder")
    return np.load(path, allow_pickle=False)


def iter_groups(rows: list[dict]) -> Iterator[tuple[str, list[dict]]]:
    """Rows grouped by their request group, in first-seen order."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    yield from groups.items()
