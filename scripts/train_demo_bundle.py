"""Rebuild the embedded demo model: a tiny reward model trained on the synthetic task.

    .venv/bin/python scripts/train_demo_bundle.py [--work DIR] [--install]

1. builds a random-weight base bundle in the release layout (DEMO_BASE below);
2. writes the synthetic moving-square task (``nvrm prefs synth``);
3. trains it with ``nvrm train`` (LoRA on the language model + the head);
4. with ``--install``, copies the exported bundle to ``src/nvrm/assets/demo-bundle``.

Prints the held-out pairwise accuracy and the wall time. Everything runs on CPU.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from nvrm.cli.main import main as nvrm
from nvrm.synth.bundles import ArchSpec, build_tiny_bundle

DEMO_BASE = ArchSpec(seed=7, rope_theta=100.0)
TASK = dict(train=400, eval=50, seed=0)
TRAIN = ["--epochs", "3", "--batch-pairs", "8", "--lr", "1e-3", "--eval-every", "100"]
ASSET = Path(__file__).resolve().parents[1] / "src" / "nvrm" / "assets" / "demo-bundle"


def run() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", help="working folder (default: a temporary one)")
    ap.add_argument("--install", action="store_true", help="copy the result into the package")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="nvrm-demo-train."))
    t0 = time.perf_counter()
    base = build_tiny_bundle(work / "base", DEMO_BASE, revision="nvrm-demo-base-1", label="random base for the nvrm demo model")
    nvrm(["prefs", "synth", "--out", str(work / "task"), "--train", str(TASK["train"]), "--eval", str(TASK["eval"]), "--seed", str(TASK["seed"])])
    rc = nvrm(["train", "--base", str(base), "--pairs", str(work / "task/train_pairs.jsonl"), "--eval-pairs",
               str(work / "task/eval_pairs.jsonl"), "--output", str(work / "run"), *TRAIN])
    print(f"wall time (base + task + training + export check): {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if rc == 0 and args.install:
        shutil.rmtree(ASSET, ignore_errors=True)
        shutil.copytree(work / "run" / "bundle", ASSET)
        print(f"installed {ASSET}")
    return rc


if __name__ == "__main__":
    sys.exit(run())
