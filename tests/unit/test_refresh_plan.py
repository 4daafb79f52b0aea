"""The refresh cycle's plan (pure): fingerprints, what a resumed cycle skips and redoes, the held-out split, the gate's arithmetic."""

import pytest

from nvrm.refresh import plan as P
from nvrm.refresh.gate import compare, reward_check, wilson


def marker(stage, fp, output="out"):
    return {"stage": stage, "fingerprint": fp, "output": output}


def chain(settings, outputs):
    """done.json markers of every stage, as a finished cycle leaves them."""
    markers, up = {}, None
    for stage in P.STAGES:
        fp = P.fingerprint(stage, settings.get(stage, {}), up)
        markers[stage] = marker(stage, fp, outputs[stage])
        up = outputs[stage]
    return markers


SETTINGS = {"pairs": {"strategy": "least-certain", "pairs_per_cycle": 8}, "judge": {"judges": ["http://j/v1"]}}
OUTPUTS = {s: f"{s}-digest" for s in P.STAGES}


def test_a_fingerprint_covers_the_settings_and_the_stage_before():
    base = P.fingerprint("pairs", {"k": 1}, "up")
    assert P.fingerprint("pairs", {"k": 1}, "up") == base
    assert P.fingerprint("pairs", {"k": 2}, "up") != base
    assert P.fingerprint("pairs", {"k": 1}, "other") != base
    assert P.fingerprint("judge", {"k": 1}, "up") != base
    assert P.digest({"a": 1, "b": 2}) == P.digest({"b": 2, "a": 1})
    with pytest.raises(ValueError):
        P.fingerprint("nope", {}, None)


def test_a_finished_cycle_skips_every_stage():
    steps = P.plan(SETTINGS, chain(SETTINGS, OUTPUTS))
    assert [s.action for s in steps] == ["skip"] * len(P.STAGES)


@pytest.mark.parametrize("gone", P.STAGES)
def test_a_missing_stage_runs_again_with_every_stage_after_it(gone):
    markers = chain(SETTINGS, OUTPUTS)
    markers[gone] = None
    steps = P.plan(SETTINGS, markers)
    k = P.STAGES.index(gone)
    assert [s.action for s in steps] == ["skip"] * k + ["run"] * (len(P.STAGES) - k)
    assert steps[k].fingerprint is not None and all(s.fingerprint is None for s in steps[k + 1:])


def test_changed_settings_redo_that_stage_and_the_rest_only():
    markers = chain(SETTINGS, OUTPUTS)
    changed = {**SETTINGS, "judge": {"judges": ["http://j/v1", "http://k/v1"]}}
    steps = P.plan(changed, markers)
    assert [s.stage for s in steps if s.action == "run"] == list(P.STAGES[P.STAGES.index("judge"):])
    assert "changed" in steps[P.STAGES.index("judge")].reason


def test_a_marker_without_an_output_is_not_done():
    fp = P.fingerprint("record", {}, None)
    assert P.decide("record", fp, {"fingerprint": fp}).action == "run"
    assert P.decide("record", fp, marker("record", fp)).action == "skip"
    assert P.decide("record", fp, "garbage").action == "run"


def test_the_holdout_takes_whole_groups_deterministically_and_never_all():
    groups, sizes = [f"g{i}" for i in range(10)], [3] * 10
    held = P.holdout_split(groups, sizes, 0.2)
    assert 0 < len(held) < 10 and sum(3 for g in held) >= 6
    assert P.holdout_split(list(reversed(groups)), sizes, 0.2) == held  # order does not matter
    assert P.holdout_split(["a", "b"], [100, 1], 0.99) != {"a", "b"}
    assert P.holdout_split(["only"], [5], 0.5) == set()
    with pytest.raises(ValueError):
        P.holdout_split(groups, sizes, 1.0)


def test_least_certain_picks_the_smallest_gaps_ties_by_id():
    gaps = [(0.5, "c"), (-0.1, "b"), (0.1, "a"), (2.0, "d")]
    assert P.pick_least_certain(gaps, 2) == ["a", "b"]
    assert P.pick_least_certain(gaps, None) == ["a", "b", "c", "d"]


def test_wilson_interval():
    assert wilson(0, 0) is None
    lo, hi = wilson(8, 10)
    assert lo < 0.8 < hi and lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert wilson(10, 10)[1] == pytest.approx(1.0)
    for k, n in [(0, 1), (0, 3), (0, 7), (3, 3), (7, 7), (1, 3)]:  # the interval holds the proportion, whatever the rounding
        lo, hi = wilson(k, n)
        assert 0 <= lo <= k / n <= hi <= 1, (k, n, lo, hi)
    assert wilson(0, 3)[0] == 0.0 and wilson(3, 3)[1] == 1.0


def side(acc, n=10):
    return {"accuracy": acc, "n": n}


def test_the_gate_compares_agreement_and_the_anchor_drop():
    assert compare(side(0.7), side(0.7), max_drop=None)["passed"]
    assert not compare(side(0.7), side(0.6), max_drop=None)["passed"]
    assert compare(side(0.9), side(0.89), max_drop=0.02)["passed"]
    assert not compare(side(0.9), side(0.85), max_drop=0.02)["passed"]
    assert not compare(side(None), side(0.9), max_drop=None)["passed"]


def test_the_reward_check_refuses_non_finite_and_collapsed_rewards():
    ok = {"n": 3, "rewards": {"all": {"std": 0.4, "mean": 0.1}}}
    assert reward_check([0.1, 0.5, -0.2], ok)["passed"]
    assert not reward_check([0.1, float("nan")], ok)["passed"]
    collapsed = {"n": 3, "rewards": {"all": {"std": 0, "mean": 0.1}}}
    assert "collapsed" in reward_check([0.1, 0.1, 0.1], collapsed)["why"]
