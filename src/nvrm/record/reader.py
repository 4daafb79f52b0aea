"""Reading a record back: its rows, the frames they name, and rollouts for ``nvrm prefs pairs --from-record``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import InputError
from . import format as fmt


@dataclass(frozen=True)
class RecordRollout:
    """One recorded group: a prompt, a context and its candidates, as a rollout (``nvrm.prefs.pairing.Rollout``) plus rewards."""

    rollout: object
    rewards: tuple[float, ...]
    revisions: tuple[str, ...]


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


def read_rows(root: str | Path) -> tuple[list[dict], list[str]]:
    """(the rows, oldest first, one message per unreadable line) of the record at ``root``."""
    root = open_record(root)
    rows, problems = [], []
    for seg in sorted((root / fmt.ROWS).glob("*.jsonl")):
        for n, line in enumerate(seg.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict) or not isinstance(obj.get("candidate"), dict) or not isinstance(obj.get("group"), str):
                    raise ValueError("not a record row")
                rows.append(obj)
            except ValueError as e:
                problems.append(f"{seg.name} line {n}: {e}")
    return rows, problems


def load_frames(root: str | Path, ref: dict) -> np.ndarray:
    """The uint8 ``(T, H, W, 3)`` frames a row's reference names (never unpickled)."""
    return np.load(Path(root) / ref["path"], allow_pickle=False)


def iter_groups(rows: list[dict]) -> Iterator[tuple[str, list[dict]]]:
    """Rows grouped by their request group, in first-seen order."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    yield from groups.items()


def record_rollouts(root: str | Path) -> tuple[list[RecordRollout], list[str]]:
    """The record's groups with at least two distinct candidates whose files are present, as rollouts; and the skipped, one line each."""
    from ..prefs.pairing import Rollout

    root = open_record(root).resolve()  # pairs files resolve relative paths against their own folder: these are absolute
    rows, problems = read_rows(root)
    out = []
    for gid, members in iter_groups(rows):
        seen, kept = set(), []
        for r in members:
            path = r["candidate"].get("path")
            if not isinstance(path, str) or path in seen or not (root / path).is_file():
                continue
            seen.add(path)
            kept.append(r)
        ctx = members[0].get("context")
        context = str(root / ctx["path"]) if isinstance(ctx, dict) else None
        if context is not None and not Path(context).is_file():
            problems.append(f"group {gid}: its context file is gone (dropped by --record-mb)")
            continue
        if len(kept) < 2:
            problems.append(f"group {gid}: {len(kept)} distinct candidate(s) left; pairs need two")
            continue
        paths = tuple(str(root / r["candidate"]["path"]) for r in kept)
        rollout = Rollout(gid, str(members[0]["prompt"]), context, paths, kept[0].get("seq", 0))  # type: ignore[arg-type]
        out.append(RecordRollout(rollout, tuple(float(r["reward"]) for r in kept), tuple(str(r.get("revision")) for r in kept)))
    return out, problems
