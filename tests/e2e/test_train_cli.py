"""nvrm prefs / nvrm train / nvrm verify as a user runs them."""

import json

from nvrm.cli.main import main


def test_synth_train_export_verify(tiny_bundle, tmp_path, capsys):
    task = tmp_path / "task"
    assert main(["prefs", "synth", "--out", str(task), "--train", "3", "--eval", "1", "--seed", "5", "--variants", "freeze,teleport,reverse,flicker"]) == 0
    assert len((task / "train_pairs.jsonl").read_text().splitlines()) == 12
    assert "wrote 12 training and 4 held-out pairs" in capsys.readouterr().out
    assert main(["prefs", "synth", "--out", str(tmp_path / "x"), "--train", "1", "--variants", "freeze,wobble"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "wobble" in err and "swap_context" in err  # names the bad kind and the known ones
    with (task / "train_pairs.jsonl").open("a") as f:  # one bad pair must not stop training
        f.write(json.dumps({"prompt": "p", "context": "clips/nope.mp4", "chosen": "a", "rejected": "b"}) + "\n")
    out = tmp_path / "run"
    rc = main(["train", "--base", str(tiny_bundle), "--pairs", str(task / "train_pairs.jsonl"), "--eval-pairs",
               str(task / "eval_pairs.jsonl"), "--output", str(out), "--epochs", "1", "--batch-pairs", "4",
               "--lora-rank", "4", "--json"])
    assert rc == 0
    cap = capsys.readouterr()
    summary = json.loads(cap.out)
    # found when its step comes up (videos are decoded as their pairs come up unless --cache-inputs or --store)
    assert "skipped pairs line 13" in cap.err and "file not found" in cap.err
    assert "step 4/4" in cap.err and "eval step 4" in cap.err and summary["world_size"] == 1
    assert summary["export_max_abs_diff"] == 0.0 and summary["eval"]["n"] == 4
    assert json.loads((out / "summary.json").read_text()) == summary
    assert (out / "checkpoints").is_dir() and (out / "metrics.jsonl").is_file()
    assert main(["verify", summary["bundle"]]) == 0
    assert main(["train", "--base", str(tiny_bundle), "--pairs", str(task / "train_pairs.jsonl"), "--output", str(out)]) == 2
    assert "pass --resume" in capsys.readouterr().err


def test_prefs_filter_cli(tmp_path, capsys):
    def j(a, b, w):
        return {"prompt": "p", "context": "c.mp4", "first": a, "second": b, "winner": w}

    rows = [j("a", "b", "first"), j("b", "a", "second"), j("a", "b", "first"), j("c", "d", "first"), j("d", "c", "first")]
    src = tmp_path / "judgments.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    out, removed = tmp_path / "pairs.jsonl", tmp_path / "removed.jsonl"
    assert main(["prefs", "filter", "--input", str(src), "--output", str(out), "--removed", str(removed)]) == 0
    cap = capsys.readouterr()
    assert [json.loads(x) for x in out.read_text().splitlines()] == [{"prompt": "p", "context": "c.mp4", "chosen": "a", "rejected": "b"}]
    assert "6 judgments -> 1 pairs" in cap.out
    for needle in ("removed      1 malformed", "removed      1 duplicate", "removed      1 inconsistent"):
        assert needle in cap.out
    reasons = sorted(json.loads(x)["reason"] for x in removed.read_text().splitlines())
    assert reasons == ["duplicate", "inconsistent", "malformed"]
