"""Rank candidates and describe the ranking: Bradley-Terry probabilities (pure).

The ranking itself (``RankEntry``, ``rank_rewards``, ``p_top``) and the one ``sigmoid`` live in
``nvrm.scoring.items``, so ``RewardModel.rank`` builds the same entries; they are re-exported here.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

from ..scoring.items import RankEntry, p_top, rank_rewards, sigmoid

__all__ = ["RankEntry", "pairwise_matrix", "p_top", "rank_rewards", "sigmoid"]


def pairwise_matrix(rewards: Sequence[float]) -> list[list[float]]:
    """``m[i][j]`` = P(i preferred over j) = sigmoid(r_i - r_j); the diagonal is 0.5."""
    return [[sigmoid(a - b) for b in rewards] for a in rewards]


def __getattr__(name: str) -> Any:
    """``Ranked``, the old name of :class:`~nvrm.scoring.items.RankEntry`, with a DeprecationWarning (until 0.6)."""
    if name == "Ranked":
        warnings.warn("nvrm.report.ranking.Ranked is deprecated and goes in 0.6: use nvrm.scoring.items.RankEntry (one ranking type)",
                      DeprecationWarning, stacklevel=2)
        return RankEntry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
