"""A record written by an RL adapter (``record=``), through ``nvrm prefs pairs --from-record --strategy active --budget N``,
``nvrm prefs judge --judge nvrm:BUNDLE`` and ``nvrm prefs filter``: the record's ``.npy`` frames are judged as the
videos they are (before, 160 failed rows of 160), and recorded uncertainties pick the pairs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from nvrm import Clip, make_reward_fn
from nvrm.cli.main import main
from nvrm.record.capture import from_rl
from nvrm.synth.clips import moving_square

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
CANDS = [Clip(moving_square(5, 64, 32, seed=20 + i, speed=1 + i), fps=1) for i in range(4)]


@pytest.fixture(scope="module")
def record(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("rec-active") / "record"
    fn = make_reward_fn(model, record=str(root))
    rewards = fn(["p"] * 4 + ["q"] * 3, [CTX] * 7, CANDS + CANDS[1:])
    from_rl(str(root)).writer.flush()
    return root, rewards


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def with_uncertainties(root: Path, folder: Path, doubt: dict[tuple[str, int], float]) -> Path:
    """A copy of the record whose rows carry uncertainties, as a guarded model's rows do (0 unless ``doubt`` names the row)."""
    copy = folder / "guarded-record"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("record.lock"))
    for seg in (copy / "rows").glob("*.jsonl"):
        rows = read(seg)
        for r in rows:
            r["uncertainty"] = doubt.get((r["prompt"], r["index"]), 0.0)
        seg.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return copy


def test_active_pairs_from_a_record_are_judged_and_filtered(record, tiny_bundle, tmp_path, capsys):
    root, _ = record
    pairs, judgments, kept = tmp_path / "pairs.jsonl", tmp_path / "judgments.jsonl", tmp_path / "train_pairs.jsonl"
    assert main(["prefs", "pairs", "--from-record", str(root), "--output", str(pairs), "--strategy", "active", "--budget", "4"]) == 0
    out = capsys.readouterr()
    assert "no candidate has an uncertainty (scored without a guard)" in out.err  # the tiny bundle has no guard: said in one line
    assert "4 pairs from 2 rollouts (active: the 4 most informative of 9" in out.out
    rows = read(pairs)
    assert len(rows) == 4 and [r["priority"] for r in rows] == sorted((r["priority"] for r in rows), reverse=True)
    assert all(r["a"].endswith(".npy") and Path(r["a"]).is_file() for r in rows)
    assert main(["prefs", "judge", "--pairs", str(pairs), "--output", str(judgments), "--judge", f"nvrm:{tiny_bundle}"]) == 0
    judged = read(judgments)
    assert len(judged) == 8 and all(j["error"] is None and j["winner"] in ("first", "second", "tie") for j in judged), judged[0]
    assert main(["prefs", "filter", "--input", str(judgments), "--output", str(kept)]) == 0
    assert len(read(kept)) == 4  # the reward model is order-consistent with itself: every pair kept


def test_recorded_uncertainties_pick_the_doubted_candidate_first(record, tmp_path, capsys):
    root, rewards = record
    top = max(range(4), key=lambda i: rewards[i])  # group p's highest reward, the one a gamed candidate would have
    guarded = with_uncertainties(root, tmp_path, {("p", top): 50.0})
    plain_out, guard_out = tmp_path / "plain.jsonl", tmp_path / "guard.jsonl"
    assert main(["prefs", "pairs", "--from-record", str(root), "--output", str(plain_out), "--strategy", "active", "--budget", "1"]) == 0
    assert main(["prefs", "pairs", "--from-record", str(guarded), "--output", str(guard_out), "--strategy", "active", "--budget", "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("no candidate has an uncertainty") == 1  # the plain record only
    (picked,) = read(guard_out)
    assert picked["prompt"] == "p" and picked["uncertainties"][picked["rewards"].index(rewards[top])] == 50.0
    others = [rewards[i] for i in range(4) if i != top]
    assert sorted(picked["rewards"]) == sorted([rewards[top], max(others)])  # paired with its group's best-trusted candidate
    (margin,) = read(plain_out)
    assert (margin["a"], margin["b"]) != (picked["a"], picked["b"]) and "uncertainties" not in margin  # without the guard: the margin


def test_refresh_keeps_the_recorded_uncertainties(record, tmp_path):
    from nvrm.refresh.cycle_stages import stage_record

    root, _ = record
    sub = tmp_path / "cycle" / "record"
    sub.mkdir(parents=True)
    said: list[str] = []
    stage_record(SimpleNamespace(record=with_uncertainties(root, tmp_path, {("q", 1): 3.5}), say=said.append), sub)
    groups = {g["prompt"]: g for g in read(sub / "rollouts.jsonl")}
    assert groups["q"]["uncertainties"] == [0.0, 3.5, 0.0] and groups["p"]["uncertainties"] == [0.0] * 4
    stage_record(SimpleNamespace(record=root, say=said.append), sub)  # recorded without a guard: the snapshot as before
    assert all("uncertainties" not in g for g in read(sub / "rollouts.jsonl"))


@pytest.mark.parametrize("flags, message", [
    (["--strategy", "active"], "--strategy active: needs --budget N"),
    (["--strategy", "active", "--budget", "0"], "--budget 0: must be at least 1 pair"),
    (["--strategy", "all", "--budget", "3"], "--budget 3: applies to --strategy active only"),
    (["--strategy", "k", "--k", "1", "--budget", "3"], "--budget 3: applies to --strategy active only"),
])
def test_bad_budget_flags_are_one_line(record, tmp_path, capsys, flags, message):
    root, _ = record
    assert main(["prefs", "pairs", "--from-record", str(root), "--output", str(tmp_path / "o.jsonl"), *flags]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
