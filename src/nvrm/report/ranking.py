"""Rank candidates and describe the ranking: Bradley-Terry probabilities (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def pairwise_matrix(rewards: Sequence[float]) -> list[list[float]]:
    """``m[i][j]`` = P(i preferred over j) = sigmoid(r_i - r_j); the diagonal is 0.5."""
    return [[sigmoid(a - b) for b in rewards] for a in rewards]


def p_top(rewards: Sequence[float]) -> list[float]:
    """P(each candidate is chosen first among all): softmax of rewards (Luce's choice rule,
    the many-way form of Bradley-Terry)."""
    m = max(rewards)
    e = [math.exp(r - m) for r in rewards]
    s = sum(e)
    return [x / s for x in e]


@dataclass(frozen=True)
class Ranked:
    index: int
    """Position in the input."""
    rank: int
    """1 = best."""
    reward: float
    p_best_over: float
    """P(the top candidate preferred over this one); 0.5 for the top itself."""
    p_top: float


def rank_rewards(rewards: Sequence[float]) -> list[Ranked]:
    """Best first; equal rewards keep input order."""
    order = sorted(range(len(rewards)), key=lambda i: (-rewards[i], i))
    top = rewards[order[0]]
    pt = p_top(rewards)
    return [Ranked(i, k + 1, rewards[i], sigmoid(top - rewards[i]), pt[i]) for k, i in enumerate(order)]
