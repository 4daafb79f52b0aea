"""Rebuild the demo bundle's members: the guard's opt-in check (docs/hacking.md, "The opt-in check: members").

    .venv/bin/python scripts/train_demo_members.py [--work DIR] [--install]

Each member is trained exactly as the demo model is (``train_demo_bundle.py``: the same random base, the same training
mix and settings) but on another draw of the synthetic task (``nvrm prefs synth --seed 10+k``) and from another
training seed (``--seed 100+k``), so it is wrong in other places. Both train at once, one thread each (about 38 min on
2 cores). Each is then added to a copy of the demo bundle with ``nvrm guard member``, calibrated on the genuine
candidates of the task's seed-1 split (the one the demo guard was fitted on); ``--install`` copies the members, and
the manifest that lists them, into ``src/nvrm/assets/demo-bundle``. The demo model's own files are not touched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ASSET = HERE.parent / "src" / "nvrm" / "assets" / "demo-bundle"
MEMBERS = (1, 2)
CALIBRATION = dict(train=24, seed=1)


def train_one(k: int, work: Path) -> None:
    """Member ``k``: the demo's recipe on task seed 10+k, training seed 100+k (runs in its own process)."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    from train_demo_bundle import DEMO_BASE, TASK, TRAIN, training_mix

    from nvrm.cli.main import main as nvrm
    from nvrm.synth.bundles import build_tiny_bundle

    base = build_tiny_bundle(work / "base", DEMO_BASE, revision="nvrm-demo-base-1", label="random base for the nvrm demo model")
    nvrm(["prefs", "synth", "--out", str(work / "task"), "--train", str(TASK["train"]), "--eval", str(TASK["eval"]), "--seed", str(10 + k)])
    training_mix(work / "task/train_pairs.jsonl", work / "task/train_mix.jsonl")
    rc = nvrm(["train", "--base", str(base), "--pairs", str(work / "task/train_mix.jsonl"), "--eval-pairs", str(work / "task/eval_pairs.jsonl"),
               "--output", str(work / "run"), "--seed", str(100 + k), *TRAIN])
    sys.exit(rc)


def drop_members(bundle: Path) -> None:
    """Remove ``bundle``'s members and their manifest entries (the copy then verifies without them)."""
    from nvrm.guard.sidecar import unlist_in_manifest

    shutil.rmtree(bundle / "nvrm_members", ignore_errors=True)
    unlist_in_manifest(bundle / "RELEASE_MANIFEST.json", "nvrm_members/")


def run() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", help="working folder (default: a temporary one)")
    ap.add_argument("--install", action="store_true", help="copy the members and the manifest into the package's demo bundle")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a member's own training process
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="nvrm-demo-members."))
    if args.one is not None:
        train_one(args.one, work / f"member-{args.one}")
        return 0
    from nvrm.cli.main import main as nvrm

    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--work", str(work), "--one", str(k)], env=env) for k in MEMBERS]
    if any(p.wait() != 0 for p in procs):
        print("a member's training failed", file=sys.stderr)
        return 1
    bundle = work / "demo-bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.copytree(ASSET, bundle)
    drop_members(bundle)
    nvrm(["prefs", "synth", "--out", str(work / "calibration"), "--train", str(CALIBRATION["train"]), "--eval", "0", "--seed", str(CALIBRATION["seed"])])
    for k in MEMBERS:
        rc = nvrm(["guard", "member", "--model", str(bundle), "--member", str(work / f"member-{k}/run/bundle"), "--pairs",
                   str(work / "calibration/train_pairs.jsonl"), "--name", f"seed-{k}"])
        if rc != 0:
            return rc
    print(f"wall time: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.install:
        shutil.rmtree(ASSET / "nvrm_members", ignore_errors=True)
        shutil.copytree(bundle / "nvrm_members", ASSET / "nvrm_members")
        shutil.copy(bundle / "RELEASE_MANIFEST.json", ASSET / "RELEASE_MANIFEST.json")
        print(f"installed the members into {ASSET}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run())
