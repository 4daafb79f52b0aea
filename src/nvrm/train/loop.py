"""One optimizer step at a time, on every rank of the run.

A step is ``grad_accum`` global micro-batches of ``batch_pairs`` pairs (``data.StepPlan``). Each
rank prepares its share of all of them first, so the run knows how many pairs of the step are
usable before any gradient is taken: the loss is the sum of the pairs' negative log-likelihoods
divided by that all-reduced count, so the step's gradient is the mean over its usable pairs at
any world size. (DDP averages gradients over ranks, hence the factor W.) Gradients are exchanged
on the last micro-batch only (``no_sync`` before it). A rank with no usable pair in a micro-batch
runs a weight-0 filler pair, so it takes part in the exchange and nobody waits for it.

A non-finite loss or gradient stops the run on every rank at that step (``TrainingError``),
before the optimizer moves: the last checkpoint on disk is the last finite model.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..errors import TrainingError
from .data import EncodedPair, Feed, StepPlan, rank_share
from .loss import pair_nll


@dataclass
class Progress:
    """Where the run is, in global units (so it resumes at any world size)."""

    step: int = 0
    epoch: int = 0
    micro: int = 0
    """Global micro-batches of the current epoch already trained on."""
    history: list[dict] = field(default_factory=list)


@dataclass
class StepStats:
    """A step's sums over every rank."""

    loss_sum: float
    pairs: int
    pref: int
    correct: float
    margin_sum: float
    lines_by_rank: list[list[int]] | None = None
    """The pairs-file lines each rank trained on this step (on rank 0)."""

    def row(self, progress: Progress, lr: float, seconds: float) -> dict[str, Any]:
        return {
            "step": progress.step,
            "epoch": progress.epoch + 1,
            "loss": self.loss_sum / self.pairs,
            "pairs": self.pairs,
            "accuracy": self.correct / self.pref if self.pref else None,
            "margin": self.margin_sum / self.pref if self.pref else None,
            "lr": lr,
            "seconds": seconds,
            "lines": sorted(x for part in (self.lines_by_rank or []) for x in part),
            **({"lines_by_rank": self.lines_by_rank} if self.lines_by_rank and len(self.lines_by_rank) > 1 else {}),
        }


class Loop:
    """Trains ``module`` (the DDP-wrapped ``RewardForward``) over the pairs of ``plan``."""

    def __init__(self, *, ranks, module, params: Sequence[torch.nn.Parameter], optimizer, feed: Feed, plan: StepPlan,
                 pairs: Sequence, tau: float, max_grad_norm: float, seed: int, say: Callable[[str], None]):
        self.ranks, self.module, self.params, self.optimizer = ranks, module, list(params), optimizer
        self.feed, self.plan, self.pairs, self.tau = feed, plan, pairs, tau
        self.max_grad_norm, self.seed, self.say = max_grad_norm, seed, say

    def _local(self, epoch: int, micro: int) -> list[list[tuple[int, Any]]]:
        """This rank's (index, pair)s of each micro-batch of the step at ``micro``."""
        r = self.ranks
        return [[(i, self.pairs[i]) for i in rank_share(batch, r.rank, r.world)] for batch in self.plan.step_batches(epoch, micro)]

    def submit(self, epoch: int, micro: int) -> list[list]:
        return [self.feed.submit(part) for part in self._local(epoch, micro)]

    def run_step(self, progress: Progress, tasks: list[list]) -> StepStats | None:
        """One step from its submitted tasks; None (on every rank) when no pair of it was usable anywhere."""
        r = self.ranks
        chunks = [self.feed.collect(j) for j in tasks]
        local = sum(len(c) for c in chunks)
        [total] = r.sum([local])
        if total == 0:
            return None
        torch.manual_seed(hash((self.seed, r.rank, progress.step)) & 0x7FFF_FFFF)  # each rank its own dropout, resumable
        self.optimizer.zero_grad(set_to_none=True)
        sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # loss, pairs, preference pairs, correct, margin
        for k, chunk in enumerate(chunks):
            last = k == len(chunks) - 1
            run = chunk or [self.feed.filler()]
            with contextlib.nullcontext() if last or r.world == 1 else self.module.no_sync():
                rewards = self.module([p.chosen for p in run] + [p.rejected for p in run])
                d = rewards[: len(run)] - rewards[len(run):]
                tie = torch.tensor([bool(p.pair and p.pair.tie) for p in run], device=d.device)
                weight = torch.tensor([p.weight for p in run], device=d.device, dtype=d.dtype)
                nll = pair_nll(d, tie, self.tau)
                loss = (nll * weight).sum() * (r.world / total)
                loss.backward()
            _tally(sums, run, nll.detach(), d.detach())
        stats = StepStats(*r.sum(sums))
        stats.pairs = int(stats.pairs)
        stats.pref = int(stats.pref)
        stats.lines_by_rank = r.gather(sorted(p.pair.line for c in chunks for p in c))
        self._check_finite(progress, stats)
        self.optimizer.step()
        return stats

    def _check_finite(self, progress: Progress, stats: StepStats) -> None:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm if self.max_grad_norm else float("inf"))
        grad_ok = math.isfinite(float(norm))
        [bad] = self.ranks.sum([0.0 if grad_ok else 1.0])  # gradients are synchronised, but agree anyway
        if not math.isfinite(stats.loss_sum) or bad:
            what = f"the loss is {stats.loss_sum / max(stats.pairs, 1):g}" if not math.isfinite(stats.loss_sum) else f"the gradient norm is {float(norm):g}"
            raise TrainingError(
                f"step {progress.step + 1}: {what}; training stopped before the optimizer moved, and the last checkpoint kept is the "
                "last finite model (lower --lr, or check the pairs that step trains on)"
            )


def _tally(sums: list[float], run: Sequence[EncodedPair], nll: torch.Tensor, d: torch.Tensor) -> None:
    for p, loss, diff in zip(run, nll.float().cpu().tolist(), d.float().cpu().tolist()):
        if p.weight == 0:
            continue
        sums[0] += loss
        sums[1] += 1
        if not p.pair.tie:
            sums[2] += 1
            sums[3] += 1.0 if diff > 0 else 0.5 if diff == 0 else 0.0
            sums[4] += diff
