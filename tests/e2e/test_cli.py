"""The nvrm command as a user runs it."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nvrm.cli.main import main

NVRM = Path(sys.executable).parent / "nvrm"


def test_score_json(tiny_bundle, clips, capsys, model):
    rc = main(["score", "--model", str(tiny_bundle), "--prompt", "Ein Hund läuft", "--context", str(clips["context"]),
               "--candidate", str(clips["cand_a"]), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reward"] == model.score("Ein Hund läuft", clips["context"], clips["cand_a"]).reward
    assert out["contract"] == model.fingerprint and out["model_revision"] == "tiny-test-0001"
    assert out["candidate_times"] == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(
    "which,needle",
    [("short", "the contract needs 5.00 s"), ("missing", "file not found"), ("text", "not a readable video")],
)
def test_bad_input_is_one_line_no_traceback(tiny_bundle, clips, tmp_path, which, needle):
    bad = {"short": clips["short"], "missing": tmp_path / "nope.mp4", "text": tmp_path / "x.mp4"}[which]
    if which == "text":
        bad.write_text("hello")
    proc = subprocess.run(
        [str(NVRM), "score", "--model", str(tiny_bundle), "--prompt", "p", "--context", str(clips["context"]), "--candidate", str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"nvrm: error: candidate {bad}") and needle in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_verify_ok_then_tampered(tiny_bundle, tmp_path, capsys):
    import shutil

    assert main(["verify", str(tiny_bundle)]) == 0
    assert "OK" in capsys.readouterr().out
    b = tmp_path / "b"
    shutil.copytree(tiny_bundle, b)
    with open(b / "nvrm_head.safetensors", "ab") as f:
        f.write(b"\0")
    assert main(["verify", str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nvrm: error:") and "nvrm_head.safetensors is" in err
    assert main(["verify", str(tmp_path / "missing")]) == 2


def test_frames_writes_exactly_what_the_model_sees(clips, tmp_path, model):
    out = tmp_path / "frames"
    assert main(["frames", "--context", str(clips["context"]), "--candidate", str(clips["cand_a"]), "--out", str(out)]) == 0
    listing = json.loads((out / "frames.json").read_text())
    prepared = model.prepare("p", clips["context"], clips["cand_a"])
    expected = list(prepared.context.images) + list(prepared.candidate.images)
    assert len(listing["frames"]) == len(expected)
    for entry, image in zip(listing["frames"], expected):
        assert np.array_equal(np.asarray(Image.open(out / entry["file"]).convert("RGB")), np.asarray(image))
    assert listing["contract"] == model.contract.fingerprint


def test_download_offline_fails_fast_with_one_line(tmp_path, capsys):
    rc = main(["download", "--revision", "0123456789abcdef0123456789abcdef01234567", "--local-dir", str(tmp_path / "d")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nvrm: error: cannot download Efficient-Large-Model/WORL-NVRM@0123456789") and "\n" not in err


def test_demo_runs_on_the_embedded_trained_bundle(capsys):
    from nvrm.bundle import verify_bundle
    from nvrm.cli.demo import demo_bundle_path

    report = verify_bundle(demo_bundle_path())  # shipped with its manifest; every file checks out
    assert report.revision.startswith("nvrm-train-")
    training = json.loads((demo_bundle_path() / "nvrm_training.json").read_text())
    held_out = training["summary"]["eval_before_export"]  # the training record travels with the bundle
    assert held_out["n"] >= 200 and held_out["failed"] == 0 and held_out["accuracy"] >= 0.85
    assert main(["demo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["demo_weights"] is True and out["bundle"] == str(demo_bundle_path())
    assert sorted(r["candidate"] for r in out["results"]) == ["flicker", "frozen", "reversed", "smooth", "teleport"]
    assert sorted(r["rank"] for r in out["results"]) == [1, 2, 3, 4, 5]
    rewards = [r["reward"] for r in out["results"]]
    assert all(np.isfinite(rewards)) and len(set(rewards)) > 1  # trained: the rewards are not flat
    assert out["results"][0]["candidate"] == "smooth"  # the continuation that keeps moving wins
    # the demo bundle ships with a guard beside its files (scripts/fit_demo_guard.py): every candidate has an uncertainty
    assert "nvrm_guard.safetensors" in json.loads((demo_bundle_path() / "RELEASE_MANIFEST.json").read_text())["files"]
    assert all(isinstance(r["uncertainty"], float) and r["uncertainty"] >= 0 for r in out["results"])


def test_embedded_demo_model_beats_the_bar_on_fresh_held_out_clips(tmp_path):
    """New synthetic examples (a seed the model never saw): pairwise accuracy well above chance."""
    from nvrm import RewardModel
    from nvrm.cli.demo import demo_bundle_path
    from nvrm.prefs.synthetic import PHYSICS, write_task

    files = write_task(tmp_path, n_train=0, n_eval=15, seed=99, variants=PHYSICS)
    model = RewardModel.from_pretrained(demo_bundle_path(), device="cpu")
    base = files["eval"].parent
    right = []
    for row in map(json.loads, files["eval"].read_text().splitlines()):
        chosen, rejected = model.score_group(row["prompt"], base / row["context"], [base / row["chosen"], base / row["rejected"]])
        right.append(chosen.reward > rejected.reward)
    assert len(right) == 60 and sum(right) / len(right) >= 0.85, sum(right)
