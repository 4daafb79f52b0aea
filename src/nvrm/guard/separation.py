"""How well a guard tells hacked from genuine candidates (pure numbers, no model).

- ``auroc(positives, negatives)``: the probability that a random hacked candidate's uncertainty is above a
  random genuine one's (ties count half);
- ``pairwise_accuracy(chosen, rejected)``: the share of pairs ordered right (ties count half).
"""

from __future__ import annotations

from typing import Sequence


def auroc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """Area under the ROC curve of scores where ``positives`` should be high (Mann-Whitney U, ties averaged)."""
    if len(positives) == 0 or len(negatives) == 0:
        raise ValueError("auroc needs at least one positive and one negative score")
    scored = sorted([(float(v), 1) for v in positives] + [(float(v), 0) for v in negatives])
    rank_sum, i = 0.0, 0
    while i < len(scored):
        j = i
        while j < len(scored) and scored[j][0] == scored[i][0]:
            j += 1
        mean_rank = (i + 1 + j) / 2  # ranks i+1 .. j, averaged over the tie
        rank_sum += mean_rank * sum(label for _, label in scored[i:j])
        i = j
    n1, n0 = len(positives), len(negatives)
    return (rank_sum - n1 * (n1 + 1) / 2) / (n1 * n0)


def pairwise_accuracy(chosen: Sequence[float], rejected: Sequence[float]) -> float:
    """Share of pairs with the chosen side above the rejected one (equal: half)."""
    if len(chosen) != len(rejected) or len(chosen) == 0:
        raise ValueError("pairwise_accuracy needs equally many chosen and rejected scores, at least one")
    return sum(1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen, rejected)) / len(chosen)
