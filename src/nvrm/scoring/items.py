"""What the scoring API takes besides videos, and its ranking entries (pure).

- ``ScoreItem`` / ``ItemLike``: one (prompt, context, candidate), as a dataclass, a triple or a dict;
- ``GroupLike``: (prompt, context, candidates), as a triple or a dict;
- ``RankEntry``: a candidate's place in a ranking (``RewardModel.rank``, ``nvrm rank``, the HTML report),
  and ``rank_rewards`` that builds the ranking;
- ``sigmoid``: the package's one logistic function (the scorer, the reports and the judges use it);
  ``bt_probability`` and ``p_top``: the Bradley-Terry probabilities of two rewards and of the best of many.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence, Union

from ..errors import InputError
from ..results import ScoreResult

Errors = Literal["raise", "return"]


@dataclass(frozen=True)
class ScoreItem:
    """One (prompt, context, candidate) triple for ``score_batch``."""

    prompt: str
    context: Any
    candidate: Any


@dataclass(frozen=True)
class RankEntry:
    """One candidate's place in a ranking: :meth:`RewardModel.rank`, ``nvrm rank`` and the HTML report
    (0.5 merged ``nvrm.report.ranking.Ranked`` into it; that name warns until 0.6)."""

    index: int
    """Position of the candidate in the input list."""
    rank: int
    """1 = best."""
    reward: float
    """The candidate's reward (the raw BF16 logit as a float)."""
    p_best_over: float
    """P(the top candidate preferred over this one); 0.5 for the top itself."""
    p_top: float
    """P(this candidate is chosen first among all): the softmax of the rewards."""
    result: ScoreResult | None = None
    """The whole score when the model ranked the candidates; None when ranked from bare rewards."""


ItemLike = Union[ScoreItem, Sequence[Any], Mapping[str, Any]]
GroupLike = Union[tuple, Sequence[Any], Mapping[str, Any]]


def as_item(item: ItemLike, i: int) -> ScoreItem:
    """An item in any accepted form, or an ``InputError`` naming it."""
    if isinstance(item, ScoreItem):
        return item
    if isinstance(item, Mapping):
        missing = [k for k in ("prompt", "context", "candidate") if k not in item]
        if missing:
            raise InputError(f"item {i}", f"missing field(s) {', '.join(missing)}")
        return ScoreItem(item["prompt"], item["context"], item["candidate"])
    if isinstance(item, (tuple, list)) and len(item) == 3:
        return ScoreItem(*item)
    raise InputError(f"item {i}", "expected ScoreItem, (prompt, context, candidate) or a dict with those keys")


def as_group(group: GroupLike, k: int) -> tuple[str, Any, list[Any]]:
    """(prompt, context, candidates) from any accepted form, or an ``InputError`` naming it."""
    if isinstance(group, Mapping):
        missing = [key for key in ("prompt", "context", "candidates") if key not in group]
        if missing:
            raise InputError(f"group {k}", f"missing field(s) {', '.join(missing)}")
        prompt, context, candidates = group["prompt"], group["context"], group["candidates"]
    elif isinstance(group, (tuple, list)) and len(group) == 3:
        prompt, context, candidates = group
    else:
        raise InputError(f"group {k}", "expected (prompt, context, candidates) or a dict with those keys")
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
        raise InputError(f"group {k}", "candidates must be a list")
    return prompt, context, list(candidates)


def sigmoid(x: float) -> float:
    """1 / (1 + e^-x), never overflowing: e^-x is only taken for x >= 0 and e^x only for x < 0 (NaN stays NaN)."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def bt_probability(r_a: float, r_b: float) -> float:
    """Bradley-Terry P(a preferred over b) = sigmoid(r_a - r_b), stable for large differences."""
    return sigmoid(r_a - r_b)


def p_top(rewards: Sequence[float]) -> list[float]:
    """P(each candidate is chosen first among all): softmax of rewards (Luce's choice rule,
    the many-way form of Bradley-Terry)."""
    m = max(rewards)
    e = [math.exp(r - m) for r in rewards]
    s = sum(e)
    return [x / s for x in e]


def rank_rewards(rewards: Sequence[float], results: Sequence[ScoreResult] | None = None) -> list[RankEntry]:
    """Best first; equal rewards keep input order. ``results[i]``, when given, rides along in candidate i's entry."""
    if not rewards:
        return []
    order = sorted(range(len(rewards)), key=lambda i: (-rewards[i], i))
    top = rewards[order[0]]
    pt = p_top(rewards)
    return [RankEntry(i, k + 1, rewards[i], sigmoid(top - rewards[i]), pt[i], results[i] if results is not None else None)
            for k, i in enumerate(order)]
