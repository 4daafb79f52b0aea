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


def test_a_pair_line_may_give_the_rejected_side_its_own_prompt_and_context(tmp_path):
    from nvrm.prefs.pairs import Pair, PairProblem, parse_pair

    p = parse_pair('{"prompt": "a", "context": "c.mp4", "chosen": "x.mp4", "rejected": "x.mp4", "rejected_prompt": "b"}', 1, tmp_path)
    assert isinstance(p, Pair) and not p.shares_condition
    assert p.sides[1] == ("b", str(tmp_path / "c.mp4"), str(tmp_path / "x.mp4"))
    q = parse_pair('{"prompt": "a", "context": "c.mp4", "chosen": "x.mp4", "rejected": "y.mp4", "rejected_context": "/o.mp4"}', 2, tmp_path)
    assert q.sides[1] == ("a", "/o.mp4", str(tmp_path / "y.mp4"))
    plain = parse_pair('{"prompt": "a", "context": "c.mp4", "chosen": "x.mp4", "rejected": "y.mp4"}', 3, tmp_path)
    assert plain.shares_condition and plain.rejected_prompt is None and plain.rejected_context is None
    bad = parse_pair('{"prompt": "a", "context": "c.mp4", "chosen": "x.mp4", "rejected": "y.mp4", "rejected_prompt": 3, "rejected_context": ""}', 4, tmp_path)
    assert isinstance(bad, PairProblem)
    assert "'rejected_prompt' must be a string" in bad.message and "'rejected_context' must be a non-empty path string" in bad.message
