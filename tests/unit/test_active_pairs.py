"""Choosing pairs for the judge under a budget (``nvrm.prefs.active``, pure): the priority, the order over a record, the
fallback without a guard, and bad input; and refresh's pairs stage with ``--strategy active``."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from nvrm.errors import InputError
from nvrm.prefs.active import Group, active_pair_rows, pair_priority, plan_active
from nvrm.prefs.pairing import Rollout


@pytest.mark.parametrize("r_a, r_b, u_a, u_b, rank, priority, p, q", [
    (0.0, 0.0, 0.0, 0.0, 0, 0.5, 0.5, 0.5),                     # the model cannot tell them apart
    (20.0, 0.0, 0.0, 0.0, 0, 0.0, 1.0, 1.0),                    # nor doubt: it is sure, and trusted
    (11.0, 5.0, 20.0, 0.0, 0, 0.9975, 0.9975, 0.0),             # a doubted reward above a trusted one: a verdict corrects it
    (11.0, 5.0, 0.5, 0.0, 0, 0.005, 0.9975, 0.9959),            # a little doubt changes little
    (0.0, 0.0, 0.0, 0.0, 1, 0.25, 0.5, 0.5),                    # second in its group: half
    (0.0, 0.0, 0.0, 0.0, 3, 0.125, 0.5, 0.5),
])
def test_the_priority_of_one_pair(r_a, r_b, u_a, u_b, rank, priority, p, q):
    got = pair_priority(r_a, r_b, u_a, u_b, rank)
    assert got == pytest.approx((priority, p, q), abs=2e-3)


# (rewards, uncertainties) per group; the pairs expected first, as (group, a, b)
ORDER_CASES = {
    "a doubted candidate meets its group's best-trusted one first, then a pair the doubt turns round, then a close one": (
        [((6.5, 11.0, -5.4, 6.9), (0.4, 18.0, 0.1, 3.0)), ((2.0, 2.3, -8.0), (0.2, 0.3, 0.0))],
        [(0, 0, 1), (0, 0, 3), (1, 0, 1)]),
    "close rewards at a group's top before close rewards at its bottom": (
        [((5.0, 5.2, -9.0, -9.05), (0.0, 0.0, 0.0, 0.0))],  # the bottom pair is the closer one
        [(0, 0, 1), (0, 2, 3)]),
    "without uncertainties: the Bradley-Terry margin (a doubted reward is not seen)": (
        [((6.5, 11.0, -5.4, 6.9), ()), ((2.0, 2.3, -8.0), ())],
        [(1, 0, 1), (0, 0, 3), (0, 1, 3)]),
    "a group with one candidate lacking an uncertainty is ranked by its rewards alone": (
        [((6.5, 11.0, -5.4, 6.9), (0.4, 18.0, 0.1, None)), ((2.0, 2.3, -8.0), (0.2, 0.3, 0.0))],
        [(1, 0, 1), (0, 0, 3), (0, 1, 3)]),
    "ties in priority: the earlier group, then the lower indices": (
        [((1.0, 1.0), ()), ((3.0, 3.0, 3.0), ())],
        [(0, 0, 1), (1, 0, 1), (1, 0, 2)]),
}


@pytest.mark.parametrize("name", list(ORDER_CASES))
def test_the_order_over_groups(name):
    groups, first = ORDER_CASES[name]
    plan = plan_active([Group(f"g{k}", r, u) for k, (r, u) in enumerate(groups)], len(first))
    assert [(p.group, p.a, p.b) for p in plan.picks] == first
    assert [p.priority for p in plan.picks] == sorted((p.priority for p in plan.picks), reverse=True)
    every = plan_active([Group(f"g{k}", r, u) for k, (r, u) in enumerate(groups)], 10_000)
    assert len(every.picks) == every.pairs == sum(len(r) * (len(r) - 1) // 2 for r, _ in groups)  # a budget past the record: every pair
    assert every.picks[: len(first)] == plan.picks  # a smaller budget is a prefix of a larger one


def test_the_priority_is_symmetric_and_bounded():
    for r_a, r_b, u_a, u_b in [(3.0, -1.0, 0.2, 4.0), (-8.0, 9.0, 0.0, 12.0), (1e6, -1e6, 0.0, 0.0)]:
        ab, ba = pair_priority(r_a, r_b, u_a, u_b), pair_priority(r_b, r_a, u_b, u_a)
        assert ab[0] == pytest.approx(ba[0]) and 0.0 <= ab[0] <= 1.0 and math.isfinite(ab[0])


@pytest.mark.parametrize("budget, message", [(0, "--budget 0: must be at least 1"), (-3, "--budget -3"), (True, "--budget True")])
def test_a_budget_under_one_pair_is_one_line(budget, message):
    with pytest.raises(InputError, match=message) as e:
        plan_active([Group("g", (0.0, 1.0))], budget)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("group, why", [
    (Group("g7", (1.0,)), "g7: has 1 candidate"),
    (Group("g7", (1.0, float("nan"))), "g7: has a reward that is not a finite number"),
    (Group("g7", (1.0, 2.0), (0.1,)), "g7: has 1 uncertainties for 2 candidates"),
    (Group("g7", (1.0, 2.0), (0.1, -1.0)), "g7: has an uncertainty that is not a finite number >= 0"),
    (Group("g7", (1.0, 2.0), (0.1, float("inf"))), "g7: has an uncertainty"),
])
def test_a_bad_group_is_one_line_naming_it(group, why):
    with pytest.raises(InputError, match=why):
        plan_active([Group("ok", (0.0, 1.0)), group], 4)


def test_the_note_says_when_the_guard_is_missing():
    guarded = Group("a", (0.0, 1.0), (0.1, 0.2))
    plain = Group("b", (0.0, 1.0))
    partial = Group("c", (0.0, 1.0), (0.1, None))
    assert plan_active([guarded], 1).note is None
    note = plan_active([plain, partial], 1).note
    assert note and note.startswith("no candidate has an uncertainty") and "Bradley-Terry margin" in note
    assert plan_active([guarded, plain, partial], 1).note.startswith("2 of 3 groups have a candidate without an uncertainty")
    assert plan_active([guarded, plain, partial], 1).guarded == 1


def rollouts(n_groups: int, n: int) -> list[Rollout]:
    return [Rollout(f"g{k}", "p", f"/c{k}.npy", tuple(f"/g{k}_{i}.npy" for i in range(n)), 0) for k in range(n_groups)]


def test_pair_rows_carry_uncertainties_and_priority_in_order():
    ros = rollouts(2, 3)
    rows, plan = active_pair_rows(ros, {"g0": [4.0, 9.0, -3.0], "g1": [0.0, 0.1, 5.0]}, {"g0": [0.1, 8.0, 0.0]}, 2)
    assert [r["priority"] for r in rows] == sorted((r["priority"] for r in rows), reverse=True)
    first = rows[0]
    assert first["pair_id"] == "g0:0-1" and first["uncertainties"] == [0.1, 8.0] and first["rewards"] == [4.0, 9.0]
    assert set(first) >= {"pair_id", "rollout", "prompt", "context", "a", "b", "rewards", "priority"}
    assert all("uncertainties" not in r for r in rows if r["rollout"] == "g1")
    assert plan.pairs == 6 and plan.groups == 2 and plan.guarded == 1
    unscored, _ = active_pair_rows(ros, {"g1": [0.0, 0.1, 5.0]}, {}, 10)  # a rollout without rewards (not scored) is left out
    assert {r["rollout"] for r in unscored} == {"g1"} and len(unscored) == 3


def test_refresh_pairs_stage_with_active_picks_over_the_whole_record(tmp_path):
    from nvrm.refresh.cycle import RefreshConfig
    from nvrm.refresh.cycle_stages import stage_pairs

    (tmp_path / "record").mkdir()
    groups = [{"id": "a", "prompt": "p", "context": "/a.mp4", "candidates": ["/a0.mp4", "/a1.mp4", "/a2.mp4"], "rewards": [5.0, 11.0, -2.0],
               "revisions": ["r"] * 3, "uncertainties": [0.2, 15.0, 0.0]},
              {"id": "b", "prompt": "p", "context": "/b.mp4", "candidates": ["/b0.mp4", "/b1.mp4"], "rewards": [1.0, 9.0], "revisions": ["r"] * 2,
               "uncertainties": [0.0, 0.1]}]
    (tmp_path / "record" / "rollouts.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))
    said: list[str] = []
    cycle = SimpleNamespace(root=tmp_path, config=RefreshConfig(strategy="active", pairs_per_cycle=2), say=said.append)
    (tmp_path / "pairs").mkdir()
    stage_pairs(cycle, tmp_path / "pairs")
    rows = [json.loads(line) for line in (tmp_path / "pairs" / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["pair_id"] == "a:0-1"  # the doubted 11.0 against its group's trusted 5.0 first
    assert any("2 pairs (active" in line for line in said) and not any("Bradley-Terry" in line for line in said)
    for g in groups:
        del g["uncertainties"]  # a record written without a guard: the margin alone, said in one line
    (tmp_path / "record" / "rollouts.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))
    stage_pairs(cycle, tmp_path / "pairs")
    assert any("no candidate has an uncertainty" in line for line in said)
