"""Which pairs to send to the judge under a budget: the most informative first (active learning; pure planning).

``nvrm prefs pairs --strategy active --budget N`` and ``nvrm refresh --strategy active`` (budget: ``--pairs-per-cycle``)
read the groups (a record's request groups, or rollouts scored by a model) and call ``plan_active``; this module only
ranks. Every pair of candidates within a group gets a priority, and the ``budget`` highest over all groups are judged.

For candidates a and b of one group, with rewards r, the guard's uncertainties u (reward units, ``ScoreResult.uncertainty``)
and conservative rewards c = r - u::

    p = sigmoid(r_a - r_b)                   the model's Bradley-Terry probability that a beats b
    q = sigmoid(c_a - c_b)                   the same once the guard's doubt is taken off both rewards
    disagree = q (1 - p) + (1 - q) p         the chance a verdict goes against the model's ranking, verdicts drawn from q
    priority = disagree / (1 + rank)         rank: where the pair's better-trusted candidate stands in its group by c (0: first)

``disagree`` is high in two cases, both of which a judge's label corrects: the guard doubts the reward that puts one
candidate above the other (a gamed candidate over a trusted one: p near 1, q near 0), or the model cannot tell the two
apart (p near 0.5). The rank discount spends the budget near the top of each group, where the policy is pushed and
where a wrong order costs most: a doubtful candidate is paired with its group's best-trusted candidate first.

A group without uncertainties (scored without a guard) has u = 0, so q = p and ``disagree`` = 2 p (1 - p): the
Bradley-Terry margin alone (the smallest |r_a - r_b| first). ``ActivePlan.note`` says so in one line.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

from ..errors import InputError
from ..scoring.items import sigmoid

STRATEGY = "active"
"""The strategy's name in ``nvrm prefs pairs`` and ``nvrm refresh``."""


@dataclass(frozen=True)
class Group:
    """One group's candidates (one prompt, one context) as the model scored them."""

    id: str
    rewards: tuple[float, ...]
    uncertainties: tuple[float | None, ...] = ()
    """Each candidate's uncertainty (None: scored without a guard); empty: none has one."""

    @property
    def guarded(self) -> bool:
        """Every candidate has an uncertainty (otherwise the group is ranked by its rewards alone)."""
        return len(self.uncertainties) == len(self.rewards) and all(u is not None for u in self.uncertainties)


@dataclass(frozen=True)
class Pick:
    """One pair chosen for the judge: candidates ``a < b`` of ``groups[group]``."""

    group: int
    a: int
    b: int
    priority: float
    p: float
    """the model's probability that a beats b (Bradley-Terry on the rewards)"""
    q: float
    """the same on the conservative rewards (``p`` without a guard)"""


@dataclass(frozen=True)
class ActivePlan:
    """The pairs to judge, the most informative first, and what they were chosen from."""

    picks: tuple[Pick, ...]
    pairs: int
    """pairs considered (every pair of every group)"""
    groups: int
    guarded: int
    """groups whose every candidate has an uncertainty"""
    note: str | None
    """one line when some or all groups were ranked by the Bradley-Terry margin alone (no uncertainties)"""


def pair_priority(r_a: float, r_b: float, u_a: float = 0.0, u_b: float = 0.0, rank: int = 0) -> tuple[float, float, float]:
    """(priority, p, q) of one pair (module docstring): rewards ``r``, uncertainties ``u``, and ``rank``, the position of the
    pair's better-trusted candidate in its group by conservative reward (0: the group's best-trusted)."""
    p = sigmoid(r_a - r_b)
    q = sigmoid((r_a - u_a) - (r_b - u_b))
    return (q * (1.0 - p) + (1.0 - q) * p) / (1.0 + rank), p, q


def _check(g: Group) -> None:
    if len(g.rewards) < 2:
        raise InputError(f"group {g.id}", f"has {len(g.rewards)} candidate(s); a pair needs two")
    if not all(isinstance(r, (int, float)) and math.isfinite(r) for r in g.rewards):
        raise InputError(f"group {g.id}", "has a reward that is not a finite number")
    if g.uncertainties and len(g.uncertainties) != len(g.rewards):
        raise InputError(f"group {g.id}", f"has {len(g.uncertainties)} uncertainties for {len(g.rewards)} candidates")
    if any(u is not None and not (math.isfinite(u) and u >= 0) for u in g.uncertainties):
        raise InputError(f"group {g.id}", "has an uncertainty that is not a finite number >= 0")


def group_pairs(g: Group) -> Iterator[tuple[float, int, int, float, float]]:
    """(priority, a, b, p, q) of every pair a < b of one group, ranked by the guard when every candidate has an uncertainty."""
    n = len(g.rewards)
    u = [float(x) for x in g.uncertainties] if g.guarded else [0.0] * n  # type: ignore[arg-type]
    trust = [g.rewards[i] - u[i] for i in range(n)]
    order = sorted(range(n), key=lambda i: (-trust[i], i))
    rank = {i: k for k, i in enumerate(order)}
    for a in range(n):
        for b in range(a + 1, n):
            priority, p, q = pair_priority(g.rewards[a], g.rewards[b], u[a], u[b], min(rank[a], rank[b]))
            yield priority, a, b, p, q


def plan_active(groups: Sequence[Group], budget: int) -> ActivePlan:
    """The ``budget`` pairs of highest priority over all ``groups`` (most informative first; ties: earlier group, then
    lower indices). A group's bad reward or uncertainty is one ``InputError`` naming it."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise InputError(f"--budget {budget}", "must be at least 1 pair to judge")
    for g in groups:
        _check(g)
    every = ((pr, -gi, -a, -b, p, q) for gi, g in enumerate(groups) for pr, a, b, p, q in group_pairs(g))
    best = heapq.nlargest(budget, every, key=lambda t: t[:4])
    picks = tuple(Pick(-gi, -a, -b, pr, p, q) for pr, gi, a, b, p, q in best)
    guarded = sum(g.guarded for g in groups)
    total = sum(len(g.rewards) * (len(g.rewards) - 1) // 2 for g in groups)
    note = None
    if groups and guarded == 0:
        note = ("no candidate has an uncertainty (scored without a guard): pairs are ranked by the Bradley-Terry margin alone "
                "(close rewards first, the top of each group first)")
    elif guarded < len(groups):
        note = (f"{len(groups) - guarded} of {len(groups)} groups have a candidate without an uncertainty: their pairs are ranked "
                "by the Bradley-Terry margin alone")
    return ActivePlan(picks, total, len(groups), guarded, note)


def active_pair_rows(rollouts: Sequence, rewards: dict[str, Sequence[float]], uncertainties: dict[str, Sequence[float | None]],
                     budget: int) -> tuple[list[dict], ActivePlan]:
    """The pairs file's rows (``nvrm.prefs.pairing.pair_rows``'s, plus each side's ``uncertainties`` where the group has them
    and the pair's ``priority``) of the ``budget`` most informative pairs over ``rollouts``, most informative first."""
    from .pairing import pair_rows

    scored = [r for r in rollouts if r.id in rewards]
    groups = [Group(r.id, tuple(rewards[r.id]), tuple(uncertainties.get(r.id) or ())) for r in scored]
    plan = plan_active(groups, budget)
    rows = []
    for pick in plan.picks:
        g = groups[pick.group]
        row = pair_rows(scored[pick.group], [(pick.a, pick.b)], g.rewards)[0]
        if g.guarded:
            row["uncertainties"] = [g.uncertainties[pick.a], g.uncertainties[pick.b]]
        row["priority"] = round(pick.priority, 6)
        rows.append(row)
    return rows, plan
