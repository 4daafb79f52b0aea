"""From a world model's rollouts to the pairs a judge compares (pure planning; ``nvrm prefs pairs`` does the I/O).

A rollouts manifest has one JSON object per line, as a world model writes them::

    {"id": "r17", "prompt": "...", "context": "ctx/17.mp4", "candidates": ["c/17_0.mp4", "c/17_1.mp4", ...]}

Paths resolve against the manifest's folder. Three ways to choose the pairs of each rollout,
deterministic for a seed:

- ``all``: every unordered pair of its N candidates (N (N - 1) / 2);
- ``k``: k of those, drawn without replacement;
- ``uncertain``: the k pairs a reward model is least sure about (smallest |r_a - r_b|, rewards from
  nvrm's group path: one shared prefill per rollout).

Rollouts also come from a rollout record (``record_rollouts``, ``nvrm prefs pairs --from-record``), with the rewards,
revisions and uncertainties it kept; ``nvrm.record`` reads the rows and knows nothing of pairs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import InputError
from ..video.paths import resolve_path

STRATEGIES = ("all", "k", "uncertain")


@dataclass(frozen=True)
class Rollout:
    """One context's candidates."""

    id: str
    prompt: str
    context: str
    candidates: tuple[str, ...]
    line: int


def read_rollouts(path: str | Path) -> tuple[list[Rollout], list[str]]:
    """(the usable rollouts, one message per line that is not one) of a rollouts manifest."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise InputError(str(path), f"cannot read the rollouts manifest ({e.strerror})") from e
    out, problems, ids = [], [], set()
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            cands = obj.get("candidates")
            if not isinstance(cands, list) or len(cands) < 2:
                raise ValueError("'candidates' must list at least two videos")
            if not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
                raise ValueError("'prompt' must be non-empty text")
            rid = str(obj.get("id", f"line{n}"))
            if rid in ids:
                raise ValueError(f"id {rid!r} appears twice")
            ids.add(rid)
            context = resolve_path(path.parent, obj.get("context"), "'context'")
            paths = tuple(resolve_path(path.parent, c, f"'candidates[{i}]'") for i, c in enumerate(cands))
            out.append(Rollout(rid, obj["prompt"], context, paths, n))
        except ValueError as e:
            problems.append(f"line {n}: {e}")
    return out, problems


@dataclass(frozen=True)
class RecordRollout:
    """One recorded group (``nvrm serve --record``, ``record=``): its rollout, plus what the record kept of each candidate."""

    rollout: Rollout
    rewards: tuple[float, ...]
    revisions: tuple[str, ...]
    uncertainties: tuple[float | None, ...] = ()
    """Each candidate's recorded uncertainty (its model's guard); None where the row has none."""


def record_rollouts(root: str | Path) -> tuple[list[RecordRollout], list[str]]:
    """The record's groups with at least two distinct candidates whose files are present, as rollouts; and the skipped, one line each."""
    from ..record.reader import iter_groups, open_record, read_rows, skipped_rows

    root = open_record(root).resolve()  # pairs files resolve relative paths against their own folder: these are absolute
    rows, bad = read_rows(root)
    problems = [summary] if (summary := skipped_rows(bad, len(rows))) else []
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
        out.append(RecordRollout(rollout, tuple(float(r["reward"]) for r in kept), tuple(str(r.get("revision")) for r in kept),
                                 tuple(_uncertainty(r) for r in kept)))
    return out, problems


def _uncertainty(row: dict) -> float | None:
    """A row's recorded uncertainty when it is a finite number >= 0 (else None: recorded without a guard, or unusable)."""
    u = row.get("uncertainty")
    return float(u) if isinstance(u, (int, float)) and not isinstance(u, bool) and math.isfinite(u) and u >= 0 else None


def _rng_key(seed: int, rollout_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}|{rollout_id}".encode()).digest()[:8], "little")


def choose_pairs(n: int, strategy: str, *, k: int = 0, seed: int = 0, rollout_id: str = "", rewards: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """Candidate index pairs (i < j) of one rollout with ``n`` candidates, in a deterministic order (pure)."""
    import random

    every = list(itertools.combinations(range(n), 2))
    if strategy == "all":
        return every
    if k < 1:
        raise InputError(f"--k {k}", f"strategy {strategy!r} needs k >= 1 pairs per context")
    if strategy == "k":
        rng = random.Random(_rng_key(seed, rollout_id))
        return sorted(rng.sample(every, min(k, len(every))))
    if strategy == "uncertain":
        if rewards is None or len(rewards) != n:
            raise InputError("uncertain", "needs one reward per candidate (scored with a reward model)")
        ranked = sorted(every, key=lambda ij: (abs(rewards[ij[0]] - rewards[ij[1]]), ij))
        return sorted(ranked[:k])
    raise InputError(f"--strategy {strategy}", f"must be one of {', '.join(STRATEGIES)}")


def pair_rows(rollout: Rollout, pairs: Sequence[tuple[int, int]], rewards: Sequence[float] | None = None) -> list[dict]:
    """The pairs file's rows for ``rollout``: ``pair_id``, ``rollout``, ``prompt``, ``context``, ``a``, ``b``."""
    rows = []
    for i, j in pairs:
        row = {"pair_id": f"{rollout.id}:{i}-{j}", "rollout": rollout.id, "prompt": rollout.prompt, "context": rollout.context,
               "a": rollout.candidates[i], "b": rollout.candidates[j]}
        if rewards is not None:
            row["rewards"] = [rewards[i], rewards[j]]
        rows.append(row)
    return rows
