"""A ``Reading``: what the guard reads of a batch of scored candidates, gathered from their one forward.

``read(tap, rows, rewards, candidates, contexts, patch_size)`` joins the ``Tap``'s per-row tensors
(``nvrm.forward.readout``) with the frame statistics of each candidate and its context, computed on the
patches the model saw (``stats.frame_stats``), into batched tensors on the model's device.

Shapes: B candidates, n frames, H hidden, K statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .stats import clip_stats


@dataclass
class Reading:
    """Per candidate, batched: everything the guard reads."""

    reward: torch.Tensor  # [B]
    last: torch.Tensor  # [B, H] the hidden state the head read
    motion: torch.Tensor  # [B, H] mean |change| of the per-frame mean vision feature between consecutive frames
    look: torch.Tensor  # [B, H] mean vision feature over the candidate's frames
    stats: torch.Tensor  # [B, K] the candidate frames' statistics (``stats.STATS``)
    context_stats: torch.Tensor  # [B, K] the context frames' statistics

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    def to(self, device) -> "Reading":
        return Reading(*(t.to(device) for t in (self.reward, self.last, self.motion, self.look, self.stats, self.context_stats)))

    def detach(self) -> "Reading":
        return Reading(*(t.detach() for t in (self.reward, self.last, self.motion, self.look, self.stats, self.context_stats)))

    def select(self, rows: Sequence[int]) -> "Reading":
        idx = torch.as_tensor(list(rows), dtype=torch.long, device=self.reward.device)
        return Reading(*(t.index_select(0, idx) for t in (self.reward, self.last, self.motion, self.look, self.stats, self.context_stats)))

    @staticmethod
    def cat(parts: Sequence["Reading"]) -> "Reading":
        return Reading(*(torch.cat([getattr(p, f) for p in parts]) for f in ("reward", "last", "motion", "look", "stats", "context_stats")))


def motion_of(frames: torch.Tensor) -> torch.Tensor:
    """[H] mean absolute change between consecutive rows of per-frame features ``frames`` [n, H] (zeros for one frame)."""
    if frames.shape[0] < 2:
        return torch.zeros_like(frames[0])
    return (frames[1:] - frames[:-1]).abs().mean(0)


def read(
    frames: Sequence[torch.Tensor],
    last: Sequence[torch.Tensor],
    rewards: torch.Tensor,
    candidates: Sequence[tuple[torch.Tensor, torch.Tensor]],
    context: Sequence[tuple[torch.Tensor, torch.Tensor]],
    patch_size: int,
) -> Reading:
    """A reading of B candidates from their per-frame mean features (``frames[b]``: [n, H]), last hidden states
    (``last[b]``: [H]), rewards [B], and the (patches, grids) of each candidate and of its context (on the device,
    or anywhere: they are moved to the features' device)."""
    device = last[0].device
    contexts = {id(p): (p, g) for p, g in context}  # a group's candidates share one context: its statistics once
    keys = list(contexts)
    both = clip_stats([(p.to(device), g) for p, g in candidates] + [(p.to(device), g) for p, g in contexts.values()], patch_size)
    stats, ctx_rows = both[: len(candidates)], both[len(candidates):]
    ctx_stats = [ctx_rows[keys.index(id(p))] for p, _ in context]
    return Reading(
        rewards.to(device).float(),
        torch.stack(list(last)),
        torch.stack([motion_of(f) for f in frames]),
        torch.stack([f.mean(0) for f in frames]),
        stats,
        torch.stack(ctx_stats),
    )
