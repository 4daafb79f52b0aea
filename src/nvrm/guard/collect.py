"""Readings of candidates for fitting or checking a guard: one group's forward, with a ``Tap`` on it.

``read_group(model, prompt, context, candidates)`` scores a group as ``score_group`` does (one shared
prefix, the same rewards bit for bit) and returns the guard's ``Reading`` of its candidates.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..errors import NvrmError
from .reading import Reading, read


def read_group(model, prompt: str, context: Any, candidates: Sequence[Any]) -> tuple[list[float | NvrmError], Reading | None]:
    """(per candidate its reward or error, the reading of the scored ones in candidate order; None if none scored)."""
    group = model.engine.prepare_group(prompt, context, list(candidates))
    out: list[float | NvrmError] = [group.slot_error(j) for j in range(len(group.candidates))]  # type: ignore[misc]
    rows = group.good
    if not rows:
        return out, None
    tap = model.runtime.tap()
    rewards, _ = model.runtime.group(group.encoded, None, tap=tap)
    for k, j in enumerate(rows):
        out[j] = rewards[k]
    reading = read(
        [tap.frames[k] for k in range(len(rows))], [tap.last[k] for k in range(len(rows))], torch.tensor(rewards),
        [(group.candidates[j].pixels, group.candidates[j].grid) for j in rows],  # type: ignore[union-attr]
        [(group.context.pixels, group.context.grid)] * len(rows),  # type: ignore[union-attr]
        model.engine.codec.patch_size if model.engine.codec is not None else 16,
    )
    return out, reading
