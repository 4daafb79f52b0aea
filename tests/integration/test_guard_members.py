"""The guard's opt-in check on a tiny bundle: a member calibrated and stored in the bundle, the uncertainty it adds on every
scoring path and in the differentiable reward (with its gradient), rewards unchanged bit for bit, and its refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from nvrm import Clip, RewardModel
from nvrm.errors import BundleError, ConfigError, InputError, IntegrityError

PROMPT = "A square glides across a tiled floor at constant speed."


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from nvrm.cli.main import main

    out = tmp_path_factory.mktemp("membertask")
    assert main(["prefs", "synth", "--out", str(out), "--train", "2", "--eval", "0", "--seed", "9"]) == 0
    return out / "train_pairs.jsonl"


@pytest.fixture(scope="module")
def with_member(tmp_path_factory, tiny_bundle, task):
    """A guarded copy of the tiny bundle with one doubting member (``helpers.doubting_member``)."""
    from helpers import doubting_member, guarded_copy

    root = tmp_path_factory.mktemp("members")
    folder = guarded_copy(tiny_bundle, root / "tiny")
    member, lowered = doubting_member(folder, root / "member", task)
    return folder, member, lowered


def _scored(folder, member):
    ex = __import__("nvrm.prefs.synthetic", fromlist=["make_example"]).make_example(11)
    ctx = Clip(ex["context"], 4)
    cands = [Clip(ex[n], 4) for n in ("preferred", "freeze", "teleport")]
    return ex, ctx, cands


def test_a_member_is_stored_in_the_bundle_listed_in_its_manifest_and_loaded_only_when_asked(with_member):
    folder, _, cal = with_member
    manifest = json.loads((folder / "RELEASE_MANIFEST.json").read_text())
    listed = [p for p in manifest["files"] if p.startswith("nvrm_members/member-1/")]
    assert "nvrm_members/member-1/nvrm_member.json" in listed and "nvrm_members/member-1/nvrm_head.safetensors" in listed
    assert any(p.endswith(".safetensors") and "model" in p for p in listed)
    with RewardModel.from_pretrained(folder, device="cpu") as plain, RewardModel.from_pretrained(folder, device="cpu", members=True) as checked:
        assert plain.members == () and [m.name for m in checked.members] == ["member-1"]
        assert checked.members[0].scale == pytest.approx(cal.scale) and checked.members[0].shift == pytest.approx(cal.shift)


def test_with_members_the_reward_is_unchanged_and_the_uncertainty_is_the_larger_of_the_guards_and_the_members_on_every_path(with_member):
    folder, member, cal = with_member
    _, ctx, cands = _scored(folder, member)
    with RewardModel.from_pretrained(folder, device="cpu") as plain, RewardModel.from_pretrained(folder, device="cpu", members=True) as checked, \
            RewardModel.from_pretrained(member, device="cpu") as alone:
        theirs = [cal.scale * r.reward + cal.shift + cal.margin for r in alone.score_group(PROMPT, ctx, cands, exact=True)]
        for name, run in [
            ("score", lambda rm: [rm.score(PROMPT, ctx, c) for c in cands]),
            ("score_group", lambda rm: rm.score_group(PROMPT, ctx, cands)),
            ("score_group exact", lambda rm: rm.score_group(PROMPT, ctx, cands, exact=True)),
            ("score_batch", lambda rm: rm.score_batch([(PROMPT, ctx, c) for c in cands])),
        ]:
            guarded, both = run(plain), run(checked)
            assert [r.reward for r in both] == [r.reward for r in guarded], name
            expected = [max(g.uncertainty, g.reward - t) for g, t in zip(guarded, theirs)]
            assert [r.uncertainty for r in both] == pytest.approx(expected, rel=1e-3, abs=0.05), name
            assert all(b.uncertainty > g.uncertainty for b, g in zip(both, guarded)), name  # the lowered member doubts every one


def test_the_differentiable_reward_with_members_is_the_worst_case_and_its_gradient_reaches_the_frames(with_member):
    folder, member, cal = with_member
    ex, ctx, _ = _scored(folder, member)
    with RewardModel.from_pretrained(folder, device="cpu", members=True) as checked, RewardModel.from_pretrained(member, device="cpu") as alone:
        frames = torch.tensor(ex["freeze"]).float().div(255).requires_grad_(True)
        scorer = checked.differentiable(conservative=1.0)
        out = scorer(PROMPT, ctx, frames, fps=4)
        theirs = cal.scale * alone.score(PROMPT, ctx, Clip(ex["freeze"], 4)).reward + cal.shift + cal.margin
        assert float(out.detach()[0]) == pytest.approx(theirs, abs=0.05)  # the member is the lowest here
        assert float(scorer.raw[0]) == checked.score(PROMPT, ctx, Clip(ex["freeze"], 4)).reward
        assert float(scorer.uncertainty[0]) == pytest.approx(checked.score(PROMPT, ctx, Clip(ex["freeze"], 4)).uncertainty, abs=0.05)
        out.sum().backward()
        assert frames.grad is not None and float(frames.grad.abs().sum()) > 0
        assert all(not p.requires_grad for m in checked.members for p in m.runtime.backbone.parameters())


def test_members_are_refused_in_one_line_when_absent_damaged_foreign_or_of_another_architecture(with_member, tiny_bundle, task, tmp_path):
    from helpers import guarded_copy

    from nvrm.synth.bundles import ArchSpec, build_tiny_bundle
    from nvrm.train import add_member

    folder, member, _ = with_member
    with pytest.raises(ConfigError, match="has no members") as e:
        RewardModel.from_pretrained(guarded_copy(tiny_bundle, tmp_path / "bare"), device="cpu", members=True)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="has no guard"):
        RewardModel.from_pretrained(member, device="cpu", members=True)
    damaged = shutil.copytree(folder, tmp_path / "damaged")
    head = damaged / "nvrm_members/member-1/nvrm_head.safetensors"
    data = bytearray(head.read_bytes())
    data[-1] ^= 1
    head.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="nvrm_members/member-1/nvrm_head.safetensors sha256"):
        RewardModel.from_pretrained(damaged, device="cpu", members=True)
    # unverified: the member's own check still holds
    with pytest.raises(BundleError, match=r"its weights are [0-9a-f]{16}, its calibration was fitted for [0-9a-f]{16}"):
        RewardModel.from_pretrained(damaged, device="cpu", members=True, verify=False)
    foreign = guarded_copy(build_tiny_bundle(tmp_path / "other-base", ArchSpec(seed=3)), tmp_path / "foreign")
    shutil.copytree(folder / "nvrm_members", foreign / "nvrm_members")
    with pytest.raises(BundleError, match=r"calibrated for weights [0-9a-f]{16} under preprocessing [0-9a-f]{16}; the model is [0-9a-f]{16}") as e:
        RewardModel.from_pretrained(foreign, device="cpu", members=True, verify=False)
    assert "\n" not in str(e.value)
    wide = build_tiny_bundle(tmp_path / "wide", ArchSpec(num_layers=3))
    with RewardModel.from_pretrained(folder, device="cpu") as m:
        with pytest.raises(BundleError, match="config.json differs"):
            add_member(m, wide, task)
        with pytest.raises(InputError, match="is the bundle itself"):
            add_member(m, folder, task)


def test_a_calibration_needs_enough_candidates_that_rise_with_the_bundles():
    from nvrm.guard.members import MIN_CANDIDATES, fit_calibration

    ids = {"model": "a", "member": "b", "preprocessing": "c"}
    xs = list(np.linspace(-2, 2, 12))
    cal = fit_calibration([2 * x + 1 for x in xs], xs, **ids)
    assert cal.scale == pytest.approx(2) and cal.shift == pytest.approx(1) and cal.corr == pytest.approx(1) and cal.margin == pytest.approx(0, abs=1e-9)
    rng = np.random.default_rng(0)
    member = rng.normal(size=400)
    ours = 2 * member + 1 + rng.normal(size=400)
    noisy = fit_calibration(ours, member, **ids)
    excess = ours - (noisy.scale * member + noisy.shift)
    assert noisy.margin == pytest.approx(np.sort(excess)[379])  # the 95th percentile of what the bundle's reward exceeds the line by
    assert 1.2 < noisy.margin < 2.1 and 0.8 < noisy.corr < 0.95
    with pytest.raises(InputError, match=f"needs at least {MIN_CANDIDATES}"):
        fit_calibration([1, 2, 3], [1, 2, 3], **ids)
    with pytest.raises(InputError, match="fall as the bundle's rise"):
        fit_calibration([-x for x in xs], xs, **ids)
    with pytest.raises(InputError, match="the same reward"):
        fit_calibration(xs, [0.0] * 12, **ids)


def test_the_cli_adds_a_member_that_verify_show_and_score_then_read(tiny_bundle, task, tmp_path, capsys):
    from helpers import guarded_copy, member_of

    from nvrm.cli.main import main

    folder = guarded_copy(tiny_bundle, tmp_path / "bundle")
    member = member_of(folder, tmp_path / "member", seed=6)
    assert main(["guard", "member", "--model", str(folder), "--member", str(member), "--pairs", str(task), "--json"]) == 0
    added = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert added["folder"].endswith("nvrm_members/member-1") and added["corr"] > 0 and added["candidates"] >= 8
    assert main(["verify", str(folder)]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["guard", "show", "--model", str(folder)]) == 0
    assert json.loads(capsys.readouterr().out)["members"]["member-1"]["scale"] == pytest.approx(added["scale"])
    rows = [json.loads(line) for line in task.read_text().splitlines()]
    item = ["--prompt", rows[0]["prompt"], "--context", str(task.parent / rows[0]["context"]), "--candidate", str(task.parent / rows[0]["rejected"])]
    scored = {}
    for flags in ([], ["--members"]):
        assert main(["score", "--model", str(folder), *item, "--json", *flags]) == 0
        scored[bool(flags)] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored[True]["reward"] == scored[False]["reward"]
    assert scored[True]["uncertainty"] >= scored[False]["uncertainty"] >= 0
    assert main(["score", "--model", str(tiny_bundle), *item, "--members"]) == 2
    err = capsys.readouterr().err
    assert "members=True" in err and "has no guard" in err and len(err.strip().splitlines()) == 1


def test_the_demo_bundle_ships_two_members_that_load_verified_and_leave_its_rewards_alone():
    """scripts/train_demo_members.py: two models trained like the demo model on other draws of the task and other seeds,
    calibrated on the guard's genuine candidates; loaded only with members=True."""
    from nvrm.cli.demo import demo_bundle_path
    from nvrm.prefs.synthetic import make_example

    ex = make_example(5_000_123)
    ctx = Clip(ex["context"], 4)
    cands = [Clip(ex[n], 4) for n in ("preferred", "freeze", "teleport", "noise")]
    with RewardModel.from_pretrained(demo_bundle_path(), device="cpu") as plain, \
            RewardModel.from_pretrained(demo_bundle_path(), device="cpu", members=True) as checked:
        assert [m.name for m in checked.members] == ["seed-1", "seed-2"] and all(m.scale > 0 for m in checked.members)
        a, b = plain.score_group(PROMPT, ctx, cands), checked.score_group(PROMPT, ctx, cands)
    assert [r.reward for r in a] == [r.reward for r in b]
    assert all(y.uncertainty >= x.uncertainty for x, y in zip(a, b))
    for m in json.loads((demo_bundle_path() / "RELEASE_MANIFEST.json").read_text())["files"]:
        assert (demo_bundle_path() / m).is_file()


def test_the_demo_members_script_drops_a_copys_members_with_their_manifest_entries(with_member, tmp_path):
    """scripts/train_demo_members.py rebuilds the members on a copy of the demo bundle: the copy must verify and load
    without the old ones (their manifest entries go with them)."""
    import importlib.util

    from nvrm.bundle import verify_bundle

    spec = importlib.util.spec_from_file_location("train_demo_members", Path(__file__).resolve().parents[2] / "scripts" / "train_demo_members.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    copy = shutil.copytree(with_member[0], tmp_path / "copy")
    script.drop_members(copy)
    assert not (copy / "nvrm_members").exists() and "nvrm_members/" not in (copy / "RELEASE_MANIFEST.json").read_text()
    assert verify_bundle(copy).files_checked > 0
    with pytest.raises(ConfigError, match="has no members"):
        RewardModel.from_pretrained(copy, device="cpu", members=True)


def test_adding_a_member_again_replaces_it_with_its_manifest_entries(with_member, task, tmp_path):
    """A member added under a name that is taken replaces the old one: the old one's entries leave the manifest (a stale
    entry would fail every verified load), the new files are listed, and the bundle verifies and loads."""
    from nvrm.bundle import verify_bundle
    from nvrm.train import add_member

    folder = shutil.copytree(with_member[0], tmp_path / "again")
    manifest = folder / "RELEASE_MANIFEST.json"
    data = json.loads(manifest.read_text())
    data["files"]["nvrm_members/member-1/model-old.safetensors"] = {"sha256": "0" * 64, "size": 1}  # a file the old member had
    manifest.write_text(json.dumps(data))
    # (a model that has its own members sampled for a monitor adds one too: the member is loaded without any)
    with RewardModel.from_pretrained(folder, device="cpu", verify=False, member_rate=0.5) as m:
        add_member(m, with_member[1], task, name="member-1")
    listed = [p for p in json.loads(manifest.read_text())["files"] if p.startswith("nvrm_members/")]
    assert "nvrm_members/member-1/model-old.safetensors" not in listed
    assert sorted(listed) == sorted(f"nvrm_members/member-1/{f.name}" for f in (folder / "nvrm_members/member-1").iterdir())
    assert verify_bundle(folder).files_checked > 0
    with RewardModel.from_pretrained(folder, device="cpu", members=True) as checked:
        assert [m.name for m in checked.members] == ["member-1"]


def test_a_member_rate_runs_the_members_on_the_share_of_calls_the_monitor_draws_and_leaves_every_result_alone(with_member, capsys,
                                                                                                           monkeypatch, caplog):
    """``member_rate``: the results are the guard's alone, bit for bit, watched or not; while a monitor watches, the calls it
    draws are checked by the members, and what it counts is what ``members=True`` gives those items; no monitor, no work."""
    from nvrm.cli.main import main
    from nvrm.guard.monitor import MonitorSettings, sampled

    folder, member, _ = with_member
    _, ctx, cands = _scored(folder, member)
    calls = 12
    with RewardModel.from_pretrained(folder, device="cpu") as plain, \
            RewardModel.from_pretrained(folder, device="cpu", member_rate=0.5) as sampled_model, \
            RewardModel.from_pretrained(folder, device="cpu", members=True) as checked:
        assert [m.name for m in sampled_model.members] == ["member-1"]
        guarded = plain.score_group(PROMPT, ctx, cands)
        assert sampled_model.score_group(PROMPT, ctx, cands) == guarded  # no monitor: the members never run
        both = checked.score_group(PROMPT, ctx, cands)
        monitor = sampled_model.watch(MonitorSettings(window=64, min_items=4))
        for _ in range(calls):
            assert sampled_model.score_group(PROMPT, ctx, cands) == guarded
        drawn = sum(sampled(0.5, f"members|{n}") for n in range(1, calls + 1))
        assert 0 < drawn < calls  # a share: some calls checked, some not
        doubtful = sum(b.uncertainty > monitor.threshold for b in both) / len(both)
        assert doubtful > 0.1  # the lowered member doubts these candidates past the guard's threshold
        snap = monitor.snapshot()
        assert snap["members"] == {"checked": drawn * len(cands), "share_above": pytest.approx(doubtful)}
        assert snap["uncertainty"]["share_above"] == pytest.approx(sum(g.uncertainty > monitor.threshold for g in guarded) / len(guarded))
        assert snap["state"] == "suspect" and "members checked" in snap["reason"], snap["reason"]
        # a member that fails on a drawn call costs the monitor that reading, never a result (one warning says so)
        broken = sampled_model.members[0].runtime
        monkeypatch.setattr(broken, "group", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("member forward broke")))
        with caplog.at_level("WARNING", logger="nvrm"):
            for _ in range(calls):
                assert sampled_model.score_group(PROMPT, ctx, cands) == guarded
        assert monitor.snapshot()["members"]["checked"] == drawn * len(cands)
        assert "member forward broke" in caplog.text and "keep the guard's" in caplog.text
        monkeypatch.undo()
        # differentiable() is the guard's alone too: a sampled share is the monitor's, never a gradient's
        frames = torch.tensor(np.stack([np.asarray(f) for f in cands[1].frames])).float().div(255)
        scorer = sampled_model.differentiable(conservative=1.0)
        scorer(PROMPT, ctx, frames, fps=4)
        assert float(scorer.uncertainty[0]) == pytest.approx(guarded[1].uncertainty, abs=1e-3)
    with pytest.raises(ConfigError, match="member_rate=0.5: .* has no guard"):
        RewardModel.from_pretrained(member, device="cpu", member_rate=0.5)  # (the member's own copy: no guard, no members)
    with pytest.raises(SystemExit) as e:  # only nvrm serve keeps a monitor, so only it takes the flag
        main(["score", "--model", str(folder), "--member-rate", "0.5", "--prompt", PROMPT, "--context", "c.mp4", "--candidate", "x.mp4"])
    assert e.value.code == 2 and "unrecognized arguments: --member-rate" in capsys.readouterr().err
