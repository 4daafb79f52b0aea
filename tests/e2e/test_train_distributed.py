"""``nvrm train`` data-parallel: 2 processes over gloo on the CPU, under torchrun and accelerate launch,
against the 1-process run at the same global batch (demo bundle, float32, one thread per process).

The runs use plain SGD with no clipping and no warm-up, so weights after a step are the start
minus lr times the step's gradient: comparing them compares gradients (Adam's first step moves a
weight by +-lr whatever its gradient's size, so a sign flip of a 1e-9 component would look like a
difference). The pairs file holds one pair whose video is missing: at 2 processes it falls on one
rank, which then runs a weight-0 filler for that micro-batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import free_port

BIN = Path(sys.executable).parent
TOLERANCE = 2e-6
"""Largest difference allowed between weights trained at 1 and 2 processes (float32 sums in another order)."""


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from nvrm.cli.main import main

    d = tmp_path_factory.mktemp("dp-task")
    assert main(["prefs", "synth", "--out", str(d), "--train", "2", "--eval", "1", "--seed", "7", "--variants", "freeze,teleport,reverse"]) == 0
    with (d / "train_pairs.jsonl").open("a") as f:
        f.write(json.dumps({"prompt": "p", "context": "clips/missing.mp4", "chosen": "a.mp4", "rejected": "b.mp4"}) + "\n")
    return d


SETTINGS = ["--optimizer", "sgd", "--lr", "0.1", "--warmup-steps", "0", "--max-grad-norm", "0", "--batch-pairs", "2", "--grad-accum", "2",
            "--epochs", "2", "--lora-rank", "4", "--save-every", "1", "--seed", "3"]


def train(task: Path, out: Path, *, procs: int, launcher: str = "torchrun", extra=(), check=True) -> subprocess.CompletedProcess:
    from nvrm.cli.demo import demo_bundle_path

    args = ["-m", "nvrm", "train", "--base", str(demo_bundle_path()), "--pairs", str(task / "train_pairs.jsonl"),
            "--eval-pairs", str(task / "eval_pairs.jsonl"), "--output", str(out), "--json", *SETTINGS, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if procs == 1:
        cmd = [sys.executable, *args]
    elif launcher == "torchrun":
        cmd = [str(BIN / "torchrun"), "--nproc-per-node", str(procs), "--master-port", str(free_port()), *args]
    else:
        env["ACCELERATE_USE_CPU"] = "true"
        cmd = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", str(procs), "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if check:  # judged by the files, not only the exit code (gloo may abort a rank at exit after the work)
        assert (out / "summary.json").is_file(), proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def metric_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "loss" in json.loads(line)]


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    out = {f"adapter/{k}": v for k, v in load_file(str(checkpoint / "adapter.safetensors")).items()}
    out.update({f"head/{k}": v for k, v in load_file(str(checkpoint / "head.safetensors")).items()})
    return out


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def one(task, tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "one"
    train(task, out, procs=1)
    return out


@pytest.fixture(scope="module")
def two(task, tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "two"
    train(task, out, procs=2)
    return out


def test_two_processes_train_the_same_global_batches_as_one(one, two):
    s1, s2 = summary(one), summary(two)
    assert s1["world_size"] == 1 and s2["world_size"] == 2 and s2["weights_in_sync"] is True
    r1, r2 = metric_rows(one), metric_rows(two)
    assert [r["step"] for r in r1] == [r["step"] for r in r2] == [1, 2, 3, 4]  # one metrics line per step
    for a, b in zip(r1, r2):
        assert a["lines"] == b["lines"]  # the same pairs each step
        ranks = b["lines_by_rank"]
        assert len(ranks) == 2 and not set(ranks[0]) & set(ranks[1]) and sorted(ranks[0] + ranks[1]) == b["lines"]  # split, no duplicates
        assert a["pairs"] == b["pairs"] and abs(a["loss"] - b["loss"]) < 1e-5
    assert sum(r["pairs"] for r in r1) == 2 * 6  # 6 good pairs an epoch; the broken one is skipped in every run
    # the first step's gradients (through plain SGD weights) and the final weights agree
    ck1, ck2 = sorted((one / "checkpoints").glob("step-*")), sorted((two / "checkpoints").glob("step-*"))
    assert [p.name for p in ck1] == [p.name for p in ck2] == ["step-000003", "step-000004"]  # one folder per save, two kept
    assert max_diff(weights(ck1[-1]), weights(ck2[-1])) < TOLERANCE


def test_the_exported_bundles_score_held_out_pairs_alike(one, two, task):
    from nvrm import RewardModel
    from nvrm.bundle import verify_bundle
    from nvrm.prefs.pairs import read_pairs
    from nvrm.report.evaluate import evaluate_pairs

    rows = read_pairs(task / "eval_pairs.jsonl")
    got = []
    for out in (one, two):
        assert verify_bundle(out / "bundle").revision == summary(out)["revision"]
        assert [p.name for p in out.iterdir() if p.name.startswith("bundle")] == ["bundle"]  # one export, by rank 0
        with RewardModel.from_pretrained(out / "bundle", device="cpu") as m:
            got.append(evaluate_pairs(m, rows)[0])
    diffs = [abs(a.chosen - b.chosen) + abs(a.rejected - b.rejected) for a, b in zip(*got)]
    assert len(diffs) == 3 and max(diffs) <= 0.0625  # bf16 rewards of weights within TOLERANCE: at most one ulp apart


def test_accelerate_launch_runs_the_same(one, task, tmp_path):
    out = tmp_path / "accelerate"
    train(task, out, procs=2, launcher="accelerate")
    assert summary(out)["world_size"] == 2 and summary(out)["weights_in_sync"]
    assert [r["lines"] for r in metric_rows(out)] == [r["lines"] for r in metric_rows(one)]
    assert max_diff(weights(sorted((out / "checkpoints").glob("step-*"))[-1]), weights(sorted((one / "checkpoints").glob("step-*"))[-1])) < TOLERANCE


@pytest.mark.parametrize("first,then", [(2, 1), (1, 2)], ids=["2-then-1", "1-then-2"])
def test_resume_at_another_world_size_equals_an_uninterrupted_run(one, task, tmp_path, first, then):
    out = tmp_path / "resumed"
    train(task, out, procs=first, extra=("--stop-after-steps", "2"))
    assert summary(out)["stopped_early"] is True and not (out / "bundle").exists()
    train(task, out, procs=then, extra=("--resume",))
    s = summary(out)
    assert s["world_size"] == then and s["steps"] == 4 and "bundle" in s
    assert [r["step"] for r in metric_rows(out)] == [1, 2, 3, 4]  # exactly one line per step across both runs
    assert [r["lines"] for r in metric_rows(out)] == [r["lines"] for r in metric_rows(one)]
    assert max_diff(weights(sorted((out / "checkpoints").glob("step-*"))[-1]), weights(sorted((one / "checkpoints").glob("step-*"))[-1])) < TOLERANCE


def test_a_launch_without_distinct_ranks_is_one_line(task, tmp_path):
    """accelerate launch --cpu --num_processes 2 starts one process: refused, not a silent single-process run."""
    from nvrm.cli.demo import demo_bundle_path

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "-m", "nvrm", "train", "--base", str(demo_bundle_path()), "--pairs", str(task / "train_pairs.jsonl"),
           "--output", str(tmp_path / "x")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("nvrm: error:")]
    assert proc.returncode != 0 and len(lines) == 1 and "--multi_gpu" in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "x").exists()
