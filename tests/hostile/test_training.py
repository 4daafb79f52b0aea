"""Training that diverges (issue 33, items 7 and 18): a non-finite loss stops the run at its step with the
last finite checkpoint kept and nothing exported; a collapsed model is not exported; a non-finite reward
is never a result; a damaged checkpoint is an unreadable-checkpoint error."""

from __future__ import annotations

import json
import math

import pytest
import torch

from nvrm.cli.main import main


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("div-task")
    assert main(["prefs", "synth", "--out", str(d), "--train", "2", "--eval", "1", "--seed", "9", "--variants", "freeze,teleport"]) == 0
    return d


def train(tiny_bundle, task, out, *extra):
    return main(["train", "--base", str(tiny_bundle), "--pairs", str(task / "train_pairs.jsonl"), "--eval-pairs", str(task / "eval_pairs.jsonl"),
                 "--output", str(out), "--epochs", "2", "--batch-pairs", "2", "--save-every", "1", "--lora-rank", "4", "--cache-inputs", *extra])


def test_a_non_finite_loss_stops_at_its_step_and_exports_nothing(tiny_bundle, task, tmp_path, capsys):
    out = tmp_path / "nan"
    assert train(tiny_bundle, task, out, "--lr", "1e30") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("nvrm: error:")]
    assert len(err) == 1 and "step 2: the loss is nan" in err[0] and "last finite model" in err[0], err
    assert not (out / "bundle").exists() and not (out / "summary.json").exists()
    [kept] = sorted((out / "checkpoints").glob("step-*"))
    assert kept.name == "step-000001"
    from safetensors.torch import load_file

    assert all(bool(torch.isfinite(t).all()) for f in ("adapter", "head") for t in load_file(str(kept / f"{f}.safetensors")).values())
    assert [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r] == [1]


def test_a_collapsed_model_is_not_exported(tiny_bundle, task, tmp_path, capsys):
    out = tmp_path / "collapsed"
    assert train(tiny_bundle, task, out, "--lr", "1e6") == 2
    err = capsys.readouterr().err
    assert "the same reward" in err and "it collapsed" in err and not (out / "bundle").exists()
    assert (out / "checkpoints").is_dir()


def test_a_non_finite_reward_is_an_error_in_its_slot_never_a_result(tiny_bundle, tmp_path, clips, capsys):
    import shutil

    from safetensors.torch import load_file, save_file

    from nvrm import RewardModel
    from nvrm.bundle import write_manifest
    from nvrm.errors import ModelError

    broken = tmp_path / "broken"
    shutil.copytree(tiny_bundle, broken)
    head = load_file(str(broken / "nvrm_head.safetensors"))
    head["rm_head.weight"][0, 0] = float("nan")
    save_file(head, str(broken / "nvrm_head.safetensors"))
    write_manifest(broken, revision="broken-0001")
    with RewardModel.from_pretrained(broken, device="cpu") as m:
        with pytest.raises(ModelError, match="non-finite reward"):
            m.score("p", clips["context"], clips["cand_a"])
        out = m.score_batch([("p", clips["context"], clips["cand_a"])] * 2, errors="return")
        assert all(isinstance(r, ModelError) for r in out)
        group = m.score_group("p", clips["context"], [clips["cand_a"], clips["cand_b"]], errors="return")
        assert all(isinstance(r, ModelError) for r in group)
        assert not any(isinstance(getattr(r, "reward", None), float) and math.isnan(r.reward) for r in out + group)
    assert main(["score", "--model", str(broken), "--prompt", "p", "--context", str(clips["context"]), "--candidate", str(clips["cand_a"])]) == 2
    assert "non-finite reward" in capsys.readouterr().err


def test_a_truncated_checkpoint_is_unreadable_not_internal(tiny_bundle, task, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(tiny_bundle, task, out, "--stop-after-steps", "1") == 0
    [ck] = sorted((out / "checkpoints").glob("step-*"))
    data = (ck / "adapter.safetensors").read_bytes()
    (ck / "adapter.safetensors").write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert train(tiny_bundle, task, out, "--resume") == 2
    err = capsys.readouterr().err
    assert "checkpoint is unreadable" in err and "internal error" not in err
