"""Training that trains nothing, stores that lie, and ranks that disagree (issue 43, items 8, 9 and 11).

- every pair unusable (videos missing, or every pair in a truncated store shard): an error, no bundle;
- a damaged shard is found (``prefs prepare`` and ``train --store`` rebuild its videos), never "already stored";
- a shard written for another contract, copied into a store, is never read;
- two ranks launched with different pairs files or settings refuse to start, naming both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import free_port
from nvrm.cli.main import main
from nvrm.errors import InputError, TrainingError
from nvrm.prefs.pairs import read_pairs
from nvrm.train import TrainConfig
from nvrm.train.data import pair_videos
from nvrm.train.store import StoreReader, read_entries
from nvrm.train.trainer import Trainer

SMALL = ["--epochs", "1", "--batch-pairs", "2", "--lora-rank", "4", "--warmup-steps", "0"]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("r4-task")
    assert main(["prefs", "synth", "--out", str(d), "--train", "2", "--eval", "1", "--seed", "11", "--variants", "freeze,teleport"]) == 0
    return d


def errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("nvrm: error:")]


def videos_of(*files) -> set:
    return {k for f in files for p in read_pairs(f) for k in pair_videos(p)}


def prepare(bundle, pairs: Path, store: Path) -> int:
    return main(["prefs", "prepare", "--model", str(bundle), "--pairs", str(pairs), "--store", str(store)])


def truncate_shards(store: Path) -> None:
    for shard in store.glob("shard-*.safetensors"):
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) * 2 // 3])


# ------------------------------------------------------------ item 8: nothing usable is an error


def test_training_where_no_pair_is_usable_is_an_error_and_exports_nothing(tiny_bundle, task, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    rows = [json.loads(line) for line in (task / "train_pairs.jsonl").read_text().splitlines()]
    with pairs.open("w") as f:
        for n, row in enumerate(rows):
            f.write(json.dumps({**row, "chosen": str(tmp_path / f"gone-{n}.mp4")}) + "\n")  # every pair names a missing video
    out = tmp_path / "run"
    capsys.readouterr()
    code = main(["train", "--base", str(tiny_bundle), "--pairs", str(pairs), "--output", str(out), *SMALL])
    err = errors(capsys.readouterr().err)
    assert code == 2 and len(err) == 1 and "no training pair" in err[0] and "usable" in err[0], err
    assert not (out / "bundle").exists() and not (out / "summary.json").exists()


def test_a_truncated_store_shard_is_no_usable_pair_and_is_named(tiny_bundle, task, tmp_path):
    store = tmp_path / "store"
    assert prepare(tiny_bundle, task / "train_pairs.jsonl", store) == 0
    truncate_shards(store)
    assert read_entries(store) == {}  # nothing in a damaged shard counts as stored
    t = Trainer(tiny_bundle, tmp_path / "out", TrainConfig(epochs=1, batch_pairs=2, lora_rank=4), device="cpu", store=store,
                log_stream=open(os.devnull, "w"))
    with pytest.raises(InputError, match="no usable training pairs"):
        t.load_pairs(task / "train_pairs.jsonl", "training")
    reader = t.feed.store
    path, role = sorted(videos_of(task / "train_pairs.jsonl"))[0]
    assert "truncated" in reader.why_missing(path, role)
    with pytest.raises(TrainingError, match="no training pair .* usable"):  # the trainer holds even when handed the pairs directly
        t.train([p for p in read_pairs(task / "train_pairs.jsonl")])
    assert not list((tmp_path / "out").glob("checkpoints/step-*"))


def test_prepare_rebuilds_a_damaged_store_instead_of_calling_it_stored(tiny_bundle, model, task, tmp_path, capsys):
    store = tmp_path / "store"
    assert prepare(tiny_bundle, task / "train_pairs.jsonl", store) == 0
    n = len(videos_of(task / "train_pairs.jsonl"))
    truncate_shards(store)
    capsys.readouterr()
    assert prepare(tiny_bundle, task / "train_pairs.jsonl", store) == 0
    said = capsys.readouterr().out
    assert f"{n} videos prepared" in said and "0 already stored" in said, said
    reader = StoreReader(store, model.fingerprint, model.contract.fingerprint)
    assert reader.missing(videos_of(task / "train_pairs.jsonl")) == []
    for path, role in sorted(videos_of(task / "train_pairs.jsonl"))[:3]:
        assert torch.equal(reader.get(path, role).pixels, model.prepare_video(path, role).pixels)


def test_train_with_a_damaged_store_rebuilds_it_and_trains(tiny_bundle, task, tmp_path, capsys):
    store = tmp_path / "store"
    assert prepare(tiny_bundle, task / "train_pairs.jsonl", store) == 0
    truncate_shards(store)
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(["train", "--base", str(tiny_bundle), "--pairs", str(task / "train_pairs.jsonl"), "--output", str(out),
                 "--store", str(store), "--json", *SMALL]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] >= 1 and (out / "bundle").is_dir()


# ------------------------------------------------------------ item 9: another contract's shard is never read


def test_a_shard_from_another_contract_copied_into_a_store_is_not_used(tiny_bundle, model, task, tmp_path, capsys):
    from nvrm import RewardModel
    from nvrm.synth.bundles import build_tiny_bundle

    pairs = task / "eval_pairs.jsonl"
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    assert prepare(tiny_bundle, pairs, mine) == 0
    other = build_tiny_bundle(tmp_path / "other", contract_overrides={"jpeg_quality": 90})  # another contract
    assert prepare(other, pairs, theirs) == 0
    path, role = sorted(videos_of(pairs))[-1]
    with RewardModel.from_pretrained(other, device="cpu") as m:
        assert not torch.equal(m.prepare_video(path, role).pixels, model.prepare_video(path, role).pixels)  # the contracts differ here
    for f in theirs.glob("shard-*"):  # copied in later: its index is the newest, so it would win
        shutil.copy(f, mine / f.name)
        os.utime(mine / f.name)
    reader = StoreReader(mine, model.fingerprint, model.contract.fingerprint)
    assert {e.shard for e in reader.entries.values()}.isdisjoint({f.name.split(".")[0] for f in theirs.glob("shard-*")})
    assert torch.equal(reader.get(path, role).pixels, model.prepare_video(path, role).pixels)
    # a foreign shard alone (its videos nowhere else in the store) is not stored: prepare builds them for this contract
    only = tmp_path / "only"
    assert prepare(tiny_bundle, task / "train_pairs.jsonl", only) == 0
    for f in only.glob("shard-*"):
        f.unlink()
    for f in theirs.glob("shard-*"):
        shutil.copy(f, only / f.name)
    assert read_entries(only) == {}
    reader = StoreReader(only, model.fingerprint, model.contract.fingerprint)
    assert "preprocessing" in reader.why_missing(path, role)
    capsys.readouterr()
    assert prepare(tiny_bundle, pairs, only) == 0
    assert f"{len(videos_of(pairs))} videos prepared" in capsys.readouterr().out


def test_a_shard_whose_header_names_another_preprocessing_is_refused_when_read(tiny_bundle, model, task, tmp_path):
    """An index edited to claim this store's fingerprint does not make another contract's patches readable."""
    from nvrm.synth.bundles import build_tiny_bundle

    pairs = task / "eval_pairs.jsonl"
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    assert prepare(tiny_bundle, pairs, mine) == 0
    assert prepare(build_tiny_bundle(tmp_path / "other", contract_overrides={"jpeg_quality": 90}), pairs, theirs) == 0
    for f in mine.glob("shard-*"):
        f.unlink()
    for f in theirs.glob("shard-*"):
        body = f.read_text() if f.name.endswith(".index.json") else None
        if body is not None:
            doc = json.loads(body)
            doc["fingerprint"], doc["contract"] = model.fingerprint, model.contract.fingerprint
            (mine / f.name).write_text(json.dumps(doc))
        else:
            shutil.copy(f, mine / f.name)
    assert read_entries(mine) == {}
    path, role = sorted(videos_of(pairs))[0]
    with pytest.raises(InputError, match="not in the prepared-input store"):
        StoreReader(mine, model.fingerprint, model.contract.fingerprint).get(path, role)


# ------------------------------------------------------------ item 11: ranks agree on their data and settings


def test_disagreement_names_the_setting_and_both_ranks():
    from nvrm.train.dist import disagreement

    same = {"batch_pairs": ["2", "2"], "training pairs": ["ab", "ab from x"]}
    assert disagreement([same, same]) is None
    seen = [{"batch_pairs": ["2", "2"], "training pairs": ["ab", "6 pairs from a.jsonl"]},
            {"batch_pairs": ["1", "1"], "training pairs": ["cd", "6 pairs from b.jsonl"]}]
    msg = disagreement(seen)
    assert "batch_pairs" in msg and "rank 0" in msg and "rank 1" in msg and "2" in msg and "1" in msg
    msg = disagreement([seen[0], {**seen[0], "training pairs": ["cd", "6 pairs from b.jsonl"]}])
    assert "a.jsonl" in msg and "b.jsonl" in msg and "rank 1" in msg
    assert "missing" in disagreement([{"x": ["1", "1"]}, {}])


def _launch_two(tmp_path: Path, argv_by_rank: dict[int, list[str]]) -> subprocess.CompletedProcess:
    script = tmp_path / "ranks.py"
    script.write_text("import os, sys\nfrom nvrm.cli.main import main\n"
                      f"ARGS = {json.dumps({str(k): v for k, v in argv_by_rank.items()})}\n"
                      "sys.exit(main(ARGS[os.environ['RANK']]))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), str(script)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:  # ranks that disagree on their schedules may wait for each other forever
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the two ranks hung instead of refusing: {err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def other_task(tmp_path_factory):
    d = tmp_path_factory.mktemp("r4-other")
    assert main(["prefs", "synth", "--out", str(d), "--train", "2", "--eval", "1", "--seed", "12", "--variants", "freeze,teleport"]) == 0
    return d


def _argv(bundle, pairs: Path, out: Path, *extra) -> list[str]:
    return ["train", "--base", str(bundle), "--pairs", str(pairs), "--output", str(out), "--json", "--epochs", "1", "--lora-rank", "4",
            "--warmup-steps", "0", *extra]


@pytest.mark.slow
def test_ranks_with_different_pairs_and_batch_sizes_refuse_to_start(tiny_bundle, task, other_task, tmp_path):
    out = tmp_path / "run"
    proc = _launch_two(tmp_path, {0: _argv(tiny_bundle, task / "train_pairs.jsonl", out, "--batch-pairs", "2"),
                                  1: _argv(tiny_bundle, other_task / "train_pairs.jsonl", out, "--batch-pairs", "4")})
    err = errors(proc.stderr)
    assert proc.returncode != 0 and err, proc.stderr[-3000:]
    assert all("disagree" in e and "rank 0" in e and "rank 1" in e and "batch_pairs" in e for e in err), err
    assert not (out / "summary.json").exists() and not (out / "bundle").exists()


@pytest.mark.slow
def test_ranks_with_different_pairs_files_refuse_before_the_first_step(tiny_bundle, task, other_task, tmp_path):
    out = tmp_path / "run"
    a, b = task / "train_pairs.jsonl", other_task / "train_pairs.jsonl"
    proc = _launch_two(tmp_path, {0: _argv(tiny_bundle, a, out, "--batch-pairs", "2"), 1: _argv(tiny_bundle, b, out, "--batch-pairs", "2")})
    err = errors(proc.stderr)
    assert proc.returncode != 0 and err, proc.stderr[-3000:]
    assert all("disagree on the training pairs" in e and str(a) in e and str(b) in e for e in err), err
    assert not (out / "summary.json").exists() and not list(out.glob("checkpoints/step-*"))
    assert not (out / "metrics.jsonl").exists() or "loss" not in (out / "metrics.jsonl").read_text()
