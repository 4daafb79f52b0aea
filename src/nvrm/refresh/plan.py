"""One refresh cycle as a chain of stages (pure: names, fingerprints, what to resume; ``cycle`` does the I/O).

A cycle folder holds one sub-folder per stage. A finished stage writes ``STAGE/done.json``::

    {"stage": "judge", "fingerprint": "<sha256 of its inputs>", "output": "<sha256 of what it wrote>"}

A stage's fingerprint covers its own settings and the ``output`` digest of the stage before it, so a
stage is redone exactly when something it reads changed: its settings, or what an earlier stage wrote.
A stage with no ``done.json`` (killed half-way, or its output deleted) runs again; every stage after a
stage that runs again runs too, since its input may change.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

STAGES = ("record", "pairs", "judge", "filter", "split", "train", "gate", "export")
"""The stages of one cycle, in order."""
DONE = "done.json"


def digest(obj: Any) -> str:
    """The sha256 of ``obj``'s canonical JSON (sorted keys): one value, one digest (pure)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def fingerprint(stage: str, settings: Mapping[str, Any], upstream_output: str | None) -> str:
    """The fingerprint of ``stage`` run with ``settings`` on what the stage before it wrote (its ``output`` digest)."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    return digest({"stage": stage, "settings": dict(settings), "input": upstream_output})


@dataclass(frozen=True)
class Step:
    """What to do about one stage: ``skip`` it (done with these inputs) or ``run`` it, and why."""

    stage: str
    action: str
    reason: str
    fingerprint: str | None
    """None: not known yet (an earlier stage runs first and its output decides)"""


def decide(stage: str, fp: str, marker: Mapping[str, Any] | None) -> Step:
    """Whether ``stage`` with fingerprint ``fp`` is done already, given its ``done.json`` (None: there is none)."""
    if not isinstance(marker, Mapping):
        return Step(stage, "run", "not run yet (or its output is gone)", fp)
    if marker.get("fingerprint") != fp or not isinstance(marker.get("output"), str):
        return Step(stage, "run", "its inputs changed since it ran", fp)
    return Step(stage, "skip", "done with these inputs", fp)


def plan(settings: Mapping[str, Mapping[str, Any]], markers: Mapping[str, Mapping[str, Any] | None]) -> list[Step]:
    """One step per stage: the leading stages done with unchanged inputs are skipped; the first that is not,
    and every stage after it, run (their fingerprints wait for the output before them). Pure."""
    steps: list[Step] = []
    upstream: str | None = None
    running = False
    for stage in STAGES:
        if running:
            steps.append(Step(stage, "run", "an earlier stage runs again", None))
            continue
        step = decide(stage, fingerprint(stage, settings.get(stage, {}), upstream), markers.get(stage))
        steps.append(step)
        if step.action == "run":
            running = True
        else:
            upstream = str(markers[stage]["output"])  # type: ignore[index]
    return steps


def holdout_split(groups: Sequence[str], sizes: Sequence[int], fraction: float) -> set[str]:
    """The groups (contexts) whose pairs are held out for the gate: about ``fraction`` of all pairs, whole groups, chosen
    by the groups' hashes (deterministic, independent of order). At least one group, and never every group. Pure."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout must be between 0 and 1 (exclusive), got {fraction}")
    if len(groups) < 2:
        return set()
    total = sum(sizes)
    want = max(1, math.ceil(fraction * total))
    order = sorted(range(len(groups)), key=lambda i: hashlib.sha256(groups[i].encode()).hexdigest())
    held: set[str] = set()
    count = 0
    for i in order[:-1]:  # the last group always trains
        if count >= want:
            break
        held.add(groups[i])
        count += sizes[i]
    return held


def pick_least_certain(gaps: Sequence[tuple[float, str]], limit: int | None) -> list[str]:
    """The ids of the ``limit`` pairs with the smallest reward gap (all when None), ties broken by id. Pure."""
    ranked = sorted(gaps, key=lambda g: (abs(g[0]), g[1]))
    return [pid for _, pid in (ranked if limit is None else ranked[:limit])]
