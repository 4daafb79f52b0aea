"""Hacked candidates: signed gradient ascent on candidate pixels through nvrm's own differentiable reward.

What a policy optimised against the reward does, in its simplest and strongest form: it moves each pixel
of a candidate by ``step`` in the direction that raises the objective, ``steps`` times, never further than
``budget`` from where it started (an L-infinity ball, in 0..1 levels). The objective is the raw reward, or,
against a guarded model, the conservative reward ``reward - λ * uncertainty`` itself (an attacker who knows
the guard and ascends what the trainer would hand the policy).

The guard's fit makes its hacked examples here (``guard_fit.py``); the benchmark makes the held-out ones here too,
with other budgets, steps and examples.

Shapes: B candidates, T frames, H x W source size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class Ascent:
    """One attacker: an L-infinity budget and a step (0..1 levels), a number of steps, and what it ascends."""

    budget: float
    step: float
    steps: int
    conservative: float | None = None
    """Ascend ``reward - conservative * uncertainty`` instead of the raw reward (needs a guard)."""


def ascend(model, prompt: str, context: Any, starts: Sequence[np.ndarray], fps: float, attacks: Sequence[Ascent]) -> list[np.ndarray]:
    """Each of ``starts`` (uint8 ``[T, H, W, 3]``, one shape) hacked by its ``attacks[b]`` against ``prompt`` and ``context``:
    the uint8 frames a policy would hand in. Candidates sharing an objective and a step count run as one batch."""
    out: list[Any] = [None] * len(starts)
    by_kind: dict[tuple, list[int]] = {}
    for b, a in enumerate(attacks):
        by_kind.setdefault((a.conservative, a.steps), []).append(b)
    for (weight, steps), rows in by_kind.items():
        scorer = model.differentiable(conservative=weight)
        x0 = torch.from_numpy(np.stack([starts[b] for b in rows])).float() / 255.0  # [b, T, H, W, 3]
        budget = torch.tensor([attacks[b].budget for b in rows], dtype=torch.float32).view(-1, 1, 1, 1, 1)
        step = torch.tensor([attacks[b].step for b in rows], dtype=torch.float32).view(-1, 1, 1, 1, 1)
        x = x0.clone()
        for _ in range(steps):
            x.requires_grad_(True)
            objective = scorer(prompt, context, x.permute(0, 1, 4, 2, 3), fps=fps)
            (grad,) = torch.autograd.grad(objective.sum(), x)
            with torch.no_grad():
                x = torch.minimum(torch.maximum(x + step * grad.sign(), x0 - budget), x0 + budget).clamp(0, 1)
        frames = (x.detach() * 255).round().clamp(0, 255).to(torch.uint8).numpy()
        for k, b in enumerate(rows):
            out[b] = frames[k]
    return out
