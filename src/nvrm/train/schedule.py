"""The run's schedule (pure): the learning rate at each optimizer step and the tie margin of the loss.

The learning rate warms up linearly over ``warmup_steps``, then follows a cosine from the full rate down to 10 % of
it at the last step; the head keeps its own base rate (``head_lr``) on the same curve.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..errors import InputError
from .config import TrainConfig


def lr_factor(step: int, warmup: int, total: int) -> float:
    """The fraction of the base learning rate at optimizer step ``step`` (from 0) of ``total``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def set_lr(optimizer: torch.optim.Optimizer, cfg: TrainConfig, step: int, total: int) -> float:
    """Set both groups' rates (adapters, head) for ``step``; returns the adapters' rate."""
    f = lr_factor(step, cfg.warmup_steps, total)
    for group, lr in zip(optimizer.param_groups, [cfg.lr, cfg.head_lr if cfg.head_lr is not None else cfg.lr]):
        group["lr"] = lr * f
    return optimizer.param_groups[0]["lr"]


def tie_margin(cfg: TrainConfig, pairs: Sequence) -> float:
    """The Rao-Kupper tie margin: ``tie_margin``, else log 2 when the pairs hold ties and 0 when they do not
    (an ``InputError`` when they hold ties and the margin is not positive)."""
    has_ties = any(p.tie for p in pairs)
    tau = cfg.tie_margin if cfg.tie_margin is not None else (math.log(2.0) if has_ties else 0.0)
    if has_ties and tau <= 0:
        raise InputError(f"tie_margin={cfg.tie_margin}", "the training pairs contain ties; a tie margin > 0 is needed")
    return tau
