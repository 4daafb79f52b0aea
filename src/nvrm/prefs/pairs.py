"""Preference pairs files (``pairs.jsonl``), shared by evaluation and training.

One JSON object per line::

    {"prompt": "...", "context": "ctx.mp4", "chosen": "a.mp4", "rejected": "b.mp4"}

with an optional ``"tie": true`` (the two candidates are equally good; which
one is called ``chosen`` does not matter) and an optional ``"id"``. Relative
paths resolve against the file's folder.

A **mismatch pair** scores the rejected side under its own condition:
``"rejected_prompt"`` and/or ``"rejected_context"`` (for instance the chosen
video again, under an unrelated prompt or another clip's context). Bradley–Terry
compares the two rewards either way; ordinary pairs only ever compare videos
within one (prompt, context), so they cannot teach the model that a video
which ignores its prompt or context deserves less.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..video.paths import resolve_path


@dataclass(frozen=True)
class Pair:
    line: int
    id: str
    prompt: str
    context: str
    chosen: str
    rejected: str
    tie: bool = False
    rejected_prompt: str | None = None
    """The rejected side's own prompt (a mismatch pair); None: ``prompt``."""
    rejected_context: str | None = None
    """The rejected side's own context (a mismatch pair); None: ``context``."""

    @property
    def sides(self) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
        """(prompt, context, video) of the chosen and of the rejected side."""
        return (
            (self.prompt, self.context, self.chosen),
            (self.prompt if self.rejected_prompt is None else self.rejected_prompt, self.rejected_context or self.context, self.rejected),
        )

    @property
    def shares_condition(self) -> bool:
        """Both sides have the same prompt and context (an ordinary pair)."""
        return self.sides[0][:2] == self.sides[1][:2]


@dataclass(frozen=True)
class PairProblem:
    line: int
    id: str
    message: str


def parse_pair(text: str, line: int, base: Path) -> Pair | PairProblem:
    rid = f"line:{line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return PairProblem(line, rid, f"pairs line {line}: not valid JSON ({e.msg})")
    except RecursionError:  # one line nested 100,000 deep is that line's problem, not the file's
        return PairProblem(line, rid, f"pairs line {line}: JSON nested too deeply")
    if not isinstance(obj, dict):
        return PairProblem(line, rid, f"pairs line {line}: expected a JSON object")
    if isinstance(obj.get("id"), (str, int)) and not isinstance(obj.get("id"), bool):
        rid = str(obj["id"])
    problems = []
    if not isinstance(obj.get("prompt"), str):
        problems.append("'prompt' must be a string")
    tie = obj.get("tie", False)
    if not isinstance(tie, bool):
        problems.append("'tie' must be true or false")
    if "rejected_prompt" in obj and not isinstance(obj["rejected_prompt"], str):
        problems.append("'rejected_prompt' must be a string")
    paths = {}
    for key in ("context", "chosen", "rejected", "rejected_context"):
        if key == "rejected_context" and key not in obj:
            continue
        try:
            paths[key] = resolve_path(base, obj.get(key), f"'{key}'")
        except ValueError as e:
            problems.append(str(e))
    if problems:
        return PairProblem(line, rid, f"pairs line {line}: {'; '.join(problems)}")
    return Pair(
        line, rid, obj["prompt"], paths["context"], paths["chosen"], paths["rejected"], tie,
        obj.get("rejected_prompt"), paths.get("rejected_context"),
    )


def read_pairs(path: str | Path) -> list[Pair | PairProblem]:
    """Every non-blank line of a pairs file, as a pair or a problem naming the line."""
    path = Path(path)
    if path.is_dir():
        raise InputError(str(path), "is a directory, not a pairs file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise InputError(str(path), "pairs file not found") from e
    except UnicodeDecodeError as e:
        raise InputError(str(path), f"pairs file is not UTF-8 text ({e.reason})") from e
    except OSError as e:
        raise InputError(str(path), f"cannot read pairs file ({e.strerror})") from e
    rows = [parse_pair(t, n, path.parent) for n, t in enumerate(text.splitlines(), start=1) if t.strip()]
    if not rows:
        raise InputError(str(path), "pairs file has no rows")
    return rows
