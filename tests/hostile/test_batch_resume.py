"""Resumes that notice what changed, and one writer per output (issue 33, items 5 and 6)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from nvrm.cli.main import main


def write_manifest(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture()
def job(tmp_path, clips):
    for name in ("context", "cand_a", "cand_b"):
        shutil.copy(clips[name], tmp_path / f"{name}.mp4")
    rows = [
        {"id": "g", "prompt": "a square moves", "context": "context.mp4", "candidates": ["cand_a.mp4", "cand_b.mp4"]},
        {"id": "s1", "prompt": "a square moves", "context": "context.mp4", "candidate": "cand_a.mp4"},
        {"id": "s2", "prompt": "a square moves", "context": "context.mp4", "candidate": "cand_b.mp4"},
    ]
    write_manifest(tmp_path / "m.jsonl", rows)
    return tmp_path, rows


def batch(tiny_bundle, d, out, *extra):
    return main(["batch", "--model", str(tiny_bundle), "--input", str(d / "m.jsonl"), "--output", str(out), *extra])


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_resume_rescores_changed_rows_drops_removed_ones_and_says_so(tiny_bundle, job, capsys, suffix):
    d, rows = job
    out = d / f"scores{suffix}"
    assert batch(tiny_bundle, d, out) == 0
    if suffix == ".csv":
        import pyarrow.csv as pcsv

        first = pcsv.read_csv(out).to_pylist()
    else:
        first = rows_of(out)
    by_key = {(r["id"], r["candidate_index"]): r for r in first}
    # the group's candidates swap places, s1 now scores another video, s2 leaves the manifest
    rows[0]["candidates"] = ["cand_b.mp4", "cand_a.mp4"]
    rows[1]["candidate"] = "cand_b.mp4"
    write_manifest(d / "m.jsonl", rows[:2])
    capsys.readouterr()
    assert batch(tiny_bundle, d, out, "--resume") == 0
    err = capsys.readouterr().err
    assert "3 row(s) changed in the manifest since they were scored, scored again: g[0], g[1], s1[0]" in err, err
    assert "1 row(s) no longer in the manifest, removed from the output: s2[0]" in err, err
    if suffix == ".csv":
        import pyarrow.csv as pcsv

        after = pcsv.read_csv(out).to_pylist()
    else:
        after = rows_of(out)
    got = {(r["id"], r["candidate_index"]): r for r in after}
    assert sorted(got) == [("g", 0), ("g", 1), ("s1", 0)]  # nothing duplicated, nothing stale left
    assert got[("g", 0)]["candidate"] == "cand_b.mp4" and got[("g", 1)]["candidate"] == "cand_a.mp4"
    assert got[("g", 0)]["reward"] == by_key[("g", 1)]["reward"] and got[("g", 1)]["reward"] == by_key[("g", 0)]["reward"]
    assert got[("s1", 0)]["reward"] == by_key[("s2", 0)]["reward"]


def test_a_video_rewritten_in_place_is_scored_again(tiny_bundle, job, capsys):
    d, _ = job
    out = d / "scores.jsonl"
    assert batch(tiny_bundle, d, out) == 0
    before = {(r["id"], r["candidate_index"]): r["reward"] for r in rows_of(out)}
    time.sleep(0.01)
    shutil.copy(d / "cand_b.mp4", d / "cand_a.mp4")  # same name, other content
    capsys.readouterr()
    assert batch(tiny_bundle, d, out, "--resume") == 0
    assert "2 row(s) changed in the manifest since they were scored, scored again: g[0], s1[0]" in capsys.readouterr().err
    after = {(r["id"], r["candidate_index"]): r["reward"] for r in rows_of(out)}
    assert len(rows_of(out)) == 4 and after[("s1", 0)] == before[("s2", 0)] and after[("s2", 0)] == before[("s2", 0)]


def test_an_unchanged_resume_scores_nothing_and_reports_nothing_stale(tiny_bundle, job, capsys):
    d, _ = job
    out = d / "scores.jsonl"
    assert batch(tiny_bundle, d, out) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert batch(tiny_bundle, d, out, "--resume") == 0
    err = capsys.readouterr()
    assert "changed in the manifest" not in err.err and "skipped 4 already in the output" in err.out + err.err
    assert out.read_bytes() == before


HOLD = """
import sys, time
from nvrm.batch.journal import Journal
j = Journal(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_run_on_a_held_output_is_refused_naming_the_holder(tiny_bundle, job, capsys):
    d, _ = job
    out = d / "scores.jsonl"
    assert batch(tiny_bundle, d, out) == 0
    before = out.read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert batch(tiny_bundle, d, out, "--resume") == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "is being written by pid " + str(holder.pid) in err[0] and "wait for that run to end" in err[0], err
        assert batch(tiny_bundle, d, out, "--overwrite") == 2  # nor replaced under it
    finally:
        holder.kill()
        holder.wait()
    assert out.read_bytes() == before
    assert batch(tiny_bundle, d, out, "--resume") == 0  # the lock goes with its holder


def test_two_concurrent_resumes_write_every_row_once(tiny_bundle, job):
    d, rows = job
    many = [{"id": f"r{i}", "prompt": "a square moves", "context": "context.mp4", "candidate": "cand_a.mp4" if i % 2 else "cand_b.mp4"} for i in range(12)]
    write_manifest(d / "m.jsonl", rows + many)
    out = d / "scores.jsonl"
    cmd = [sys.executable, "-m", "nvrm", "batch", "--model", str(tiny_bundle), "--input", str(d / "m.jsonl"), "--output", str(out), "--resume"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    keys = [(r["id"], r["candidate_index"]) for r in rows_of(out)]
    assert len(keys) == len(set(keys)) == 16
    codes = sorted(code for code, _ in results)
    if codes == [0, 2]:  # they overlapped: the second was refused with one line
        refused = next(err for code, err in results if code == 2)
        assert "is being written by pid" in refused
    else:  # one finished before the other opened the output: the second found nothing to do
        assert codes == [0, 0]
