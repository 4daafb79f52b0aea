"""nvrm batch / rank / eval as users run them: durable, resumable, nothing lost."""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nvrm.cli.main import main
from helpers import GROUP_ULPS, bf16_ulp

NVRM = Path(sys.executable).parent / "nvrm"




@pytest.fixture(scope="module")
def job(tmp_path_factory, clips):
    """A manifest next to its clips (relative paths), with good rows, a group and bad rows."""
    d = tmp_path_factory.mktemp("job")
    for k in ("context", "cand_a", "cand_b", "short"):
        shutil.copy(clips[k], d / clips[k].name)
    (d / "junk.mp4").write_text("not a video")
    rows = [{"id": f"s{i}", "prompt": f"prompt {i % 3}", "context": "context.mp4", "candidate": ["cand_a.mp4", "cand_b.mp4"][i % 2]} for i in range(12)]
    rows.insert(3, {"id": "g", "prompt": "group", "context": "context.mp4", "candidates": ["cand_a.mp4", "junk.mp4", "cand_b.mp4", "short.mp4"]})
    rows.insert(6, {"id": "gone", "prompt": "p", "context": "context.mp4", "candidate": "missing.mp4"})
    rows.insert(8, {"id": "badctx", "prompt": "p", "context": "junk.mp4", "candidates": ["cand_a.mp4", "cand_b.mp4"]})
    lines = [json.dumps(r) for r in rows]
    lines.insert(10, '{"id": "broken", "prompt": ')
    (d / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    expected = {(f"s{i}", 0) for i in range(12)} | {("g", k) for k in range(4)} | {("gone", 0), ("badctx", 0), ("badctx", 1), ("line:11", 0)}
    return d, expected


def read_rows(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def check_rows(rows, expected, model, d):
    keys = [(r["id"], r["candidate_index"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicated rows"
    assert set(keys) == expected, "missing or extra rows"
    by = {(r["id"], r["candidate_index"]): r for r in rows}
    for i in range(12):
        r = by[(f"s{i}", 0)]
        want = model.score(f"prompt {i % 3}", d / "context.mp4", d / ["cand_a.mp4", "cand_b.mp4"][i % 2]).reward
        assert r["error"] is None and abs(r["reward"] - want) <= GROUP_ULPS * bf16_ulp(want)
        assert r["contract"] == model.fingerprint and r["model_revision"] == "tiny-test-0001"
    assert by[("g", 0)]["reward"] is not None and by[("g", 2)]["reward"] is not None
    assert "not a readable video" in by[("g", 1)]["error"] and by[("g", 1)]["candidate"] == "junk.mp4"
    assert "the contract needs 5.00 s" in by[("g", 3)]["error"]
    assert "file not found" in by[("gone", 0)]["error"]
    assert all("context" in by[("badctx", k)]["error"] and by[("badctx", k)]["reward"] is None for k in (0, 1))
    assert "manifest line 11: not valid JSON" in by[("line:11", 0)]["error"]
    for r in rows:
        assert r["off_contract"] is None  # the release contract: nothing off it
        assert (r["reward"] is None) != (r["error"] is None)
        assert r["error"] is None or "\n" not in r["error"]


def test_batch_writes_one_row_per_candidate_and_reports(model, tiny_bundle, job, capsys):
    d, expected = job
    out = d / "scores.jsonl"
    rc = main(["batch", "--model", str(tiny_bundle), "--input", str(d / "manifest.jsonl"), "--output", str(out), "--flush-every", "4"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "scored 14, failed 6, skipped 0" in captured.out
    assert "nvrm batch: 20/20 rows" in captured.err  # plain progress lines when not on a terminal
    check_rows(read_rows(out), expected, model, d)
    assert main(["batch", "--model", str(tiny_bundle), "--input", str(d / "manifest.jsonl"), "--output", str(out)]) == 2
    assert "already exists; pass --resume" in capsys.readouterr().err


def test_off_contract_rewards_are_named_in_their_rows_and_counted(job, tmp_path, capsys):
    from nvrm.synth.bundles import build_tiny_bundle

    d, _ = job
    bundle = build_tiny_bundle(tmp_path / "short-ok", contract_overrides={"short_candidates": True})
    out = tmp_path / "scores.jsonl"
    assert main(["batch", "--model", str(bundle), "--input", str(d / "manifest.jsonl"), "--output", str(out)]) == 0
    assert "scored 15 (1 off-contract: see each row's off_contract), failed 5" in capsys.readouterr().out
    by = {(r["id"], r["candidate_index"]): r for r in read_rows(out)}
    assert by[("g", 3)]["off_contract"] == "short candidate: 4 of 5 frames" and by[("g", 3)]["reward"] is not None
    assert all(r["off_contract"] is None for k, r in by.items() if k != ("g", 3))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_batch_csv_and_parquet(model, tiny_bundle, job, suffix):
    from nvrm.batch.sink import read_final

    d, expected = job
    out = d / f"scores{suffix}"
    assert main(["batch", "--model", str(tiny_bundle), "--input", str(d / "manifest.jsonl"), "--output", str(out)]) == 0
    check_rows(read_final(out, suffix[1:]), expected, model, d)


def test_sigkill_then_resume_loses_and_duplicates_nothing(model, tiny_bundle, job):
    d, expected = job
    out = d / "killed.jsonl"
    proc = subprocess.Popen(
        [str(NVRM), "batch", "--model", str(tiny_bundle), "--input", str(d / "manifest.jsonl"), "--output", str(out), "--flush-every", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 4:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the job finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = out.read_text().count("\n")
    assert 4 <= written < len(expected)
    with out.open("a") as f:  # what a kill in the middle of a write leaves behind
        f.write('{"id": "s9", "candidate_index": 0, "rew')
    rc = main(["batch", "--model", str(tiny_bundle), "--input", str(d / "manifest.jsonl"), "--output", str(out), "--resume"])
    assert rc == 0
    check_rows(read_rows(out), expected, model, d)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def test_rank_html_report_renders_in_headless_chromium(model, tiny_bundle, clips, tmp_path, capsys):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("Debian's chromium is not installed; `make test` installs it (apt-get install chromium)")
    html = tmp_path / "report.html"
    cands = [str(clips["cand_a"]), str(clips["cand_b"]), str(clips["context"])]
    rc = main(["rank", "--model", str(tiny_bundle), "--prompt", "a <b>bold</b> prompt", "--context", str(clips["context"]), *cands,
               "--html", str(html), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    want = [r.reward for r in model.score_group("a <b>bold</b> prompt", clips["context"], cands)]
    assert sorted(((e["index"], e["reward"]) for e in out["ranking"])) == list(enumerate(want))
    assert [e["rank"] for e in out["ranking"]] == [1, 2, 3]
    assert all(a["reward"] >= b["reward"] for a, b in zip(out["ranking"], out["ranking"][1:]))
    page = html.read_text()
    assert "a &lt;b&gt;bold&lt;/b&gt; prompt" in page and "<b>bold</b>" not in page
    n_images = 6 + 3 * 5  # context frames + 5 per candidate
    assert page.count("<img ") == n_images
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(common + ["--virtual-time-budget=5000", "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert f'data-images-ok="{n_images}"' in dom.stdout, dom.stderr[-2000:]
    shot = tmp_path / "shot.png"
    subprocess.run(common + ["--window-size=1280,1400", f"--screenshot={shot}", html.as_uri()], capture_output=True, timeout=120)
    assert png_size(shot) == (1280, 1400)
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    # the frames are there: a textured region, not a blank page or a broken-image icon
    assert pixels.std() > 30 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 500


def test_eval_reports_accuracy_margin_and_a_plot(model, tiny_bundle, job, tmp_path, capsys):
    d, _ = job
    pairs = d / "pairs.jsonl"
    rows = [
        {"prompt": "p", "context": "context.mp4", "chosen": "cand_a.mp4", "rejected": "cand_b.mp4"},
        {"prompt": "q", "context": "context.mp4", "chosen": "cand_b.mp4", "rejected": "cand_a.mp4"},
        {"prompt": "p", "context": "context.mp4", "chosen": "cand_a.mp4", "rejected": "cand_b.mp4", "tie": True},
        {"prompt": "p", "context": "context.mp4", "chosen": "missing.mp4", "rejected": "cand_b.mp4"},
    ]
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    plot = tmp_path / "plot.png"
    assert main(["eval", "--model", str(tiny_bundle), "--pairs", str(pairs), "--json", "--plot", str(plot)]) == 0
    cap = capsys.readouterr()
    s = json.loads(cap.out)
    margins = []
    for r in rows[:2]:
        rc, rr = model.score_group(r["prompt"], d / r["context"], [d / r["chosen"], d / r["rejected"]])
        margins.append(rc.reward - rr.reward)
    acc = sum(1.0 if m > 0 else 0.5 if m == 0 else 0.0 for m in margins) / 2
    assert (s["n"], s["n_ties"], s["failed"]) == (2, 1, 1)
    assert s["accuracy"] == pytest.approx(acc) and s["mean_margin"] == pytest.approx(sum(margins) / 2)
    assert "pairs line 4" in cap.err and "file not found" in cap.err
    assert png_size(plot)[0] > 500


def test_output_equal_to_the_manifest_is_refused_and_the_manifest_kept(tiny_bundle, job, tmp_path, capsys):
    d, _ = job
    manifest = tmp_path / "m.jsonl"
    shutil.copy(d / "manifest.jsonl", manifest)
    before = manifest.read_bytes()
    rc = main(["batch", "--model", str(tiny_bundle), "--input", str(manifest), "--output", str(manifest), "--overwrite"])
    assert rc == 2 and manifest.read_bytes() == before
    assert "is the input manifest" in capsys.readouterr().err


def test_a_non_utf8_row_becomes_an_error_row(tiny_bundle, job, tmp_path, capsys):
    d, _ = job
    m = d / "mixed.jsonl"
    good = json.dumps({"id": "ok", "prompt": "p", "context": "context.mp4", "candidate": "cand_a.mp4"}).encode()
    m.write_bytes(good + b"\n" + b'{"id": "bad", "prompt": "caf\xe9"}\n')
    out = tmp_path / "mixed-out.jsonl"
    assert main(["batch", "--model", str(tiny_bundle), "--input", str(m), "--output", str(out)]) == 0
    rows = {r["id"]: r for r in read_rows(out)}
    assert rows["ok"]["error"] is None and "not UTF-8" in rows["line:2"]["error"]


def test_a_full_disk_ends_in_one_line_and_resume_completes(tiny_bundle, job, tmp_path):
    d, expected = job
    out = tmp_path / "full.jsonl"
    # RLIMIT_FSIZE: writes past 1 KB fail (what `ulimit -f` does); Python ignores SIGXFSZ, so write() fails
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024)); "
        "from nvrm.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    args = ["batch", "--model", str(tiny_bundle), "--input", str(d / "manifest.jsonl"), "--output", str(out), "--flush-every", "2"]
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("nvrm: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"nvrm: error: {out}: cannot write (File too large)")
    assert "Traceback" not in proc.stderr
    assert main(args[:-2] + ["--resume"]) == 0
    rows = read_rows(out)
    assert {(r["id"], r["candidate_index"]) for r in rows} == expected and len(rows) == len(expected)


def test_rows_failed_for_internal_reasons_make_the_exit_code_one(tiny_bundle, job, tmp_path, capsys, monkeypatch):
    from nvrm.forward.runtime import ForwardRuntime

    def out_of_memory(self, enc, prefix):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 275251200 bytes")

    monkeypatch.setattr(ForwardRuntime, "group", out_of_memory)
    d, expected = job
    out = tmp_path / "scores.jsonl"
    assert main(["batch", "--model", str(tiny_bundle), "--input", str(d / "manifest.jsonl"), "--output", str(out)]) == 1
    by = {(r["id"], r["candidate_index"]): r for r in read_rows(out)}
    assert set(by) == expected  # every row is still written, none lost
    internal = sorted(k for k, r in by.items() if (r["error"] or "").startswith("internal error"))
    assert f"({len(internal)} for internal reasons, not their input: see their error)" in capsys.readouterr().out
    assert ("g", 0) in internal and ("g", 2) in internal and ("g", 1) not in internal  # junk.mp4 keeps its own error
    assert any(r["reward"] is not None for r in by.values())  # the rest scored
