"""``nvrm guard fit`` end to end on a tiny bundle: pairs in the format nvrm train reads, real gradient attacks, the guard
written beside the release's files and listed in the manifest, read back by every command; too few pairs is one line."""

from __future__ import annotations

import json
import shutil

import pytest

from nvrm.cli.main import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    out = tmp_path_factory.mktemp("guardtask")
    assert main(["prefs", "synth", "--out", str(out), "--train", "2", "--eval", "0", "--seed", "9"]) == 0
    return out / "train_pairs.jsonl"


def test_guard_fit_writes_a_listed_guard_that_every_command_then_reads(tiny_bundle, task, tmp_path, capsys):
    bundle = shutil.copytree(tiny_bundle, tmp_path / "bundle")
    rc = main(["guard", "fit", "--model", str(bundle), "--pairs", str(task), "--attacks", "8", "--adaptive-rounds", "0", "--holdout", "0",
               "--batch", "4", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["hacked"] >= 8 and summary["genuine"] >= 32 and summary["adaptive_rounds"] == 0
    manifest = json.loads((bundle / "RELEASE_MANIFEST.json").read_text())
    assert "nvrm_guard.safetensors" in manifest["files"]
    assert main(["verify", str(bundle)]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["guard", "show", "--model", str(bundle)]) == 0
    assert json.loads(capsys.readouterr().out)["info"]["hacked"] == summary["hacked"]
    rows = [json.loads(line) for line in task.read_text().splitlines()]
    ctx, cand = str(task.parent / rows[0]["context"]), str(task.parent / rows[0]["rejected"])
    assert main(["score", "--model", str(bundle), "--prompt", rows[0]["prompt"], "--context", ctx, "--candidate", cand, "--json"]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["uncertainty"] is not None and scored["uncertainty"] >= 0


def test_too_few_pairs_is_one_line_naming_the_count_needed(tiny_bundle, task, tmp_path, capsys):
    few = tmp_path / "few.jsonl"
    lines = task.read_text().splitlines()[:5]
    few.write_text("\n".join(lines) + "\n")
    rc = main(["guard", "fit", "--model", str(tiny_bundle), "--pairs", str(few)])
    err = capsys.readouterr().err
    assert rc == 2 and "5 usable pair(s); a guard needs at least 16" in err and len(err.strip().splitlines()) == 1
