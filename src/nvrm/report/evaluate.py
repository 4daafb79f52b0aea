"""Reward accuracy on preference pairs: metrics (pure) and a PNG plot.

Accuracy counts the standard way for pairwise reward models: over pairs
labelled with a preference (not ties), a pair is correct when the chosen
candidate's reward is higher; an exactly equal pair of rewards counts half.
Pairs labelled ``tie`` are excluded from accuracy and summarised on their own
(how close the two rewards are: mean |r_a - r_b|). Pairs that fail to score
are counted in ``failed`` and in no other number.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..scoring.items import sigmoid


@dataclass(frozen=True)
class PairOutcome:
    chosen: float
    rejected: float
    tie: bool = False

    @property
    def margin(self) -> float:
        return self.chosen - self.rejected


def _summary(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    xs = sorted(values)

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {
        "mean": statistics.fmean(xs),
        "std": statistics.pstdev(xs),
        "min": xs[0],
        "p25": q(0.25),
        "median": q(0.5),
        "p75": q(0.75),
        "max": xs[-1],
    }


def summarize(outcomes: Sequence[PairOutcome], failed: int = 0) -> dict[str, Any]:
    """Metrics over scored pairs; see the module doc for how ties count."""
    pref = [o for o in outcomes if not o.tie]
    ties = [o for o in outcomes if o.tie]
    correct = sum(1.0 if o.margin > 0 else 0.5 if o.margin == 0 else 0.0 for o in pref)
    margins = [o.margin for o in pref]
    return {
        "accuracy": correct / len(pref) if pref else None,
        "n": len(pref),
        "mean_margin": statistics.fmean(margins) if margins else None,
        "mean_p_chosen": statistics.fmean(sigmoid(m) for m in margins) if margins else None,
        "n_ties": len(ties),
        "tie_mean_abs_diff": statistics.fmean(abs(o.margin) for o in ties) if ties else None,
        "failed": failed,
        "rewards": {
            "chosen": _summary([o.chosen for o in pref]),
            "rejected": _summary([o.rejected for o in pref]),
            "all": _summary([r for o in outcomes for r in (o.chosen, o.rejected)]),
        },
        "tie_rule": "ties excluded from accuracy; equal rewards on a preference pair count 0.5",
    }


def plot_pairs(outcomes: Sequence[PairOutcome], path: str | Path, title: str = "") -> Path:
    """Scatter of chosen vs rejected reward (below the diagonal = correct) and a margin histogram."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path = Path(path)
    pref = [o for o in outcomes if not o.tie]
    ties = [o for o in outcomes if o.tie]
    fig, (ax, hx) = plt.subplots(1, 2, figsize=(10, 4.6), dpi=110)
    rs = [r for o in outcomes for r in (o.chosen, o.rejected)] or [0.0, 1.0]
    lo, hi = min(rs), max(rs)
    pad = (hi - lo) * 0.05 or 0.5
    ok = [o for o in pref if o.margin > 0]
    bad = [o for o in pref if o.margin <= 0]
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="#888", lw=1, ls="--", label="equal reward")
    ax.scatter([o.chosen for o in ok], [o.rejected for o in ok], s=14, color="#1a7f37", label=f"correct ({len(ok)})")
    ax.scatter([o.chosen for o in bad], [o.rejected for o in bad], s=14, color="#cf222e", label=f"wrong or equal ({len(bad)})")
    if ties:
        ax.scatter([o.chosen for o in ties], [o.rejected for o in ties], s=14, marker="x", color="#0969da", label=f"tie ({len(ties)})")
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel("reward of chosen")
    ax.set_ylabel("reward of rejected")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("chosen vs rejected")
    hx.hist([o.margin for o in pref] or [0.0], bins=30, color="#0969da")
    hx.axvline(0, color="#888", ls="--", lw=1)
    hx.set_xlabel("margin r(chosen) - r(rejected)")
    hx.set_ylabel("pairs")
    hx.set_title("margins")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def evaluate_pairs(model, pairs) -> tuple[list[PairOutcome], list[str]]:
    """Score every pair, streamed: an ordinary pair as one group (shared context), a mismatch pair as two.

    Args:
        model: a ``RewardModel``.
        pairs: ``Pair``s and ``PairProblem``s from ``read_pairs``.

    Returns:
        (outcomes of the pairs that scored, one line per pair that did not).
    """
    from ..errors import NvrmError
    from ..prefs.pairs import PairProblem

    problems = [p.message for p in pairs if isinstance(p, PairProblem)]
    good = [p for p in pairs if not isinstance(p, PairProblem)]
    outcomes: list[PairOutcome] = []

    def groups():
        for p in good:
            if p.shares_condition:
                yield (p.prompt, p.context, [p.chosen, p.rejected])
            else:
                for prompt, context, video in p.sides:
                    yield (prompt, context, [video])

    results = iter(model.score_groups(groups(), errors="return"))

    def both(p):
        return next(results) if p.shares_condition else [next(results)[0], next(results)[0]]

    for p in good:
        rc, rr = both(p)
        bad = rc if isinstance(rc, NvrmError) else rr if isinstance(rr, NvrmError) else None
        if bad is not None:
            problems.append(f"pairs line {p.line}: {bad}")
        else:
            outcomes.append(PairOutcome(rc.reward, rr.reward, p.tie))
    return outcomes, problems
