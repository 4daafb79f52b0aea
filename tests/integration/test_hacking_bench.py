"""``nvrm bench --workload hacking``'s parts on a guarded tiny bundle, small: held-out detection rows and their summary,
the over-optimisation curves against the oracle, the guard's cost, the report and the figures."""

from __future__ import annotations

import pytest

from nvrm import RewardModel
from nvrm.bench import hacking

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, tiny_bundle):
    from helpers import guarded_copy

    folder = guarded_copy(tiny_bundle, tmp_path_factory.mktemp("guarded") / "tiny")
    with RewardModel.from_pretrained(folder, device="cpu") as m:
        yield m


def test_the_oracle_scores_the_straight_line_one_and_a_frozen_square_lower():
    from nvrm.prefs.synthetic import make_example

    task = hacking.task_of(5)
    ex = make_example(5)
    preferred, frozen = ex["preferred"][::4][:5], ex["freeze"][::4][:5]  # the 1 FPS frames the contract samples
    assert hacking.gold_score(preferred, task) > 0.9
    assert hacking.gold_score(frozen, task) < hacking.gold_score(preferred, task) - 0.2
    assert hacking.gold_score(frozen * 0, task) == 0.0  # no square found


def test_detection_overoptimisation_and_cost_on_a_small_run(guarded, tmp_path):
    attackers = (hacking.Attacker("ascent 16/255", 16, 4.0, 2), hacking.Attacker("conservative ascent 16/255", 16, 4.0, 2, 1.0))
    det = hacking.run_detection(guarded, 1, 3_000_000, attackers, squeezed=True)
    s = det["summary"]
    assert all(isinstance(r["squeezed"], float) for r in det["rows"])  # the opt-in check's second forward, on every row
    sq = s["opt_in_squeeze"]
    assert 0 <= sq["at_or_above_preferred"] <= 2 and 0.0 <= sq["pairwise_accuracy"] <= 1.0 and 0.0 <= sq["drop_auroc"] <= 1.0
    assert s["hacked"] == 2 and s["genuine"] == 2 * 15 + 2 and 0.0 <= s["auroc"] <= 1.0
    assert set(s["by_attacker"]) == {a.name for a in attackers}
    assert 0.0 <= s["pairwise_accuracy"]["raw"] <= 1.0 and s["pairwise_accuracy"]["pairs"] == 2 * 14 + 2
    over = hacking.run_overoptimisation(guarded, [4_000_000], 2)
    curves = {r["conservative"]: r["curve"] for r in over["runs"]}
    assert set(curves) == {None, 1.0} and all(len(c) == 3 for c in curves.values())
    assert curves[1.0][0]["objective"] == pytest.approx(curves[1.0][0]["proxy"] - curves[1.0][0]["uncertainty"], abs=1e-4)
    cost = hacking.run_guard_cost(guarded, 3, 2)
    assert set(cost["median_s"]) == {"with guard", "without"} and guarded.guard is not None
    ratios = sorted(w / o for w, o in zip(cost["times"]["with guard"], cost["times"]["without"]))
    assert cost["paired_overhead"] == pytest.approx((ratios[0] + ratios[1]) / 2 - 1.0)  # the pairs' own ratios, median of 2
    assert 0 < cost["guard_work_s"] < cost["median_s"]["with guard"]  # timed in the guarded calls only
    report = {"bundle": "tiny", "cost": cost, "detection": det, "overoptimisation": over}
    text = hacking.format_hacking(report)
    assert "AUROC" in text and "over-optimisation" in text and "guard cost" in text
    paths = hacking.plot_hacking(report, str(tmp_path / "plots"))
    assert len(paths) == 2 and all((tmp_path / "plots" / p.rsplit("/", 1)[-1]).stat().st_size > 1000 for p in paths)


def test_cost_on_an_architecture_uses_a_stand_in_guard_at_the_asked_frame_size(tmp_path, monkeypatch):
    import json

    from nvrm.cli.main import main

    monkeypatch.setenv("NVRM_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "cost.json"
    assert main(["bench", "--workload", "hacking", "--cost-arch", "tiny", "--G", "2", "--cost-repeats", "2", "--size", "48x80",
                 "--device", "cpu", "--output", str(out)]) == 0
    cost = json.loads(out.read_text())["cost"]
    assert cost["group"] == 2 and cost["frame_size"] == [48, 80] and len(cost["times"]["with guard"]) == 2
    assert (tmp_path / "cache" / "bench-bundle-tiny-standin-guard" / "nvrm_guard.safetensors").is_file()
