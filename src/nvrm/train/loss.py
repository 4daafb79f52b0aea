"""Pairwise losses on reward differences (pure torch).

Preference pairs use the Bradley-Terry likelihood, P(chosen > rejected) =
sigmoid(d) with d = r_chosen - r_rejected, so the loss is softplus(-d).

Ties use the Rao-Kupper extension with a margin tau >= 0 (theta = e^tau):

    P(a > b) = sigmoid(d - tau),  P(b > a) = sigmoid(-d - tau),
    P(tie)   = 1 - P(a > b) - P(b > a)
             = e^d (e^{2 tau} - 1) / ((e^d + e^tau)(1 + e^{d + tau}))

With tau = 0 the model is plain Bradley-Terry (and a tie has probability 0);
with tau > 0 preference pairs use sigmoid(d - tau), so the model must
separate preferred pairs by more than tau while keeping tied pairs within it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def log_p_win(d: torch.Tensor, tau: float = 0.0) -> torch.Tensor:
    """log P(chosen > rejected) for reward differences ``d``."""
    return F.logsigmoid(d - tau)


def log_p_tie(d: torch.Tensor, tau: float) -> torch.Tensor:
    """log P(tie) under Rao-Kupper; needs ``tau > 0``."""
    if tau <= 0:
        raise ValueError("tied pairs need a tie margin tau > 0")
    const = math.log(math.expm1(2 * tau))
    return d + const - torch.logaddexp(d, torch.full_like(d, tau)) - F.softplus(d + tau)


def pair_nll(d: torch.Tensor, tie: torch.Tensor, tau: float = 0.0) -> torch.Tensor:
    """Negative log-likelihood of each pair; ``tie`` is a bool mask."""
    nll = -log_p_win(d, tau)
    if bool(tie.any()):
        nll = torch.where(tie, -log_p_tie(d, tau), nll)
    return nll


def pair_loss(d: torch.Tensor, tie: torch.Tensor, tau: float = 0.0) -> torch.Tensor:
    """Mean negative log-likelihood over pairs; ``tie`` is a bool mask."""
    return pair_nll(d, tie, tau).mean()
