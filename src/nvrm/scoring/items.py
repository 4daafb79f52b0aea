"""What the scoring API takes besides videos, and its ranking entries (pure).

- ``ScoreItem`` / ``ItemLike``: one (prompt, context, candidate), as a dataclass, a triple or a dict;
- ``GroupLike``: (prompt, context, candidates), as a triple or a dict;
- ``RankEntry``: a candidate's place in ``RewardModel.rank``;
- ``bt_probability``: the Bradley-Terry preference probability of two rewards.
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
    """One candidate's place in :meth:`RewardModel.rank` output."""

    index: int
    """Position of the candidate in the input list."""
    rank: int
    """1 = best."""
    result: ScoreResult

    @property
    def reward(self) -> float:
        """The candidate's reward (the raw BF16 logit as a float)."""
        return self.result.reward


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


def bt_probability(r_a: float, r_b: float) -> float:
    """Bradley-Terry P(a preferred over b) = sigmoid(r_a - r_b), stable for large differences."""
    x = r_a - r_b
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
