"""Pairwise metrics and Bradley-Terry ranking maths (pure)."""

import math

import pytest

from nvrm.report.evaluate import PairOutcome, summarize
from nvrm.report.ranking import p_top, pairwise_matrix, rank_rewards


def test_accuracy_counts_equal_rewards_half_and_excludes_ties():
    outcomes = [
        PairOutcome(2.0, 1.0),  # correct
        PairOutcome(1.0, 3.0),  # wrong
        PairOutcome(1.5, 1.5),  # equal: half
        PairOutcome(0.0, 4.0, tie=True),  # excluded
    ]
    s = summarize(outcomes, failed=2)
    assert s["accuracy"] == pytest.approx(0.5) and s["n"] == 3 and s["n_ties"] == 1 and s["failed"] == 2
    assert s["mean_margin"] == pytest.approx((1.0 - 2.0 + 0.0) / 3)
    assert s["tie_mean_abs_diff"] == pytest.approx(4.0)
    assert s["rewards"]["chosen"]["max"] == 2.0 and s["rewards"]["rejected"]["median"] == 1.5
    assert summarize([])["accuracy"] is None


def test_pairwise_probabilities_and_ranking():
    r = [0.0, 2.0, 2.0, -1.0]
    m = pairwise_matrix(r)
    assert m[1][0] == pytest.approx(1 / (1 + math.exp(-2.0))) and m[0][1] == pytest.approx(1 - m[1][0])
    assert all(m[i][i] == 0.5 for i in range(4))
    assert sum(p_top(r)) == pytest.approx(1.0)
    ranked = rank_rewards(r)
    assert [x.index for x in ranked] == [1, 2, 0, 3]  # a tie keeps input order
    assert [x.rank for x in ranked] == [1, 2, 3, 4]
    assert ranked[2].p_best_over == pytest.approx(m[1][0])
