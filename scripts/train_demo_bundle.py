"""Rebuild the embedded demo model: a tiny reward model trained on the synthetic task.

    .venv/bin/python scripts/train_demo_bundle.py [--work DIR] [--install]

1. builds a random-weight base bundle in the release layout (DEMO_BASE below);
2. writes the synthetic moving-square task (``nvrm prefs synth``) and its training mix
   (``training_mix``: per example the broken-motion pairs twice, the subtle degradations,
   and two of the other kinds);
3. trains it with ``nvrm train`` (LoRA on the language model + the head), evaluating on
   every kind of the held-out split;
4. with ``--install``, copies the exported bundle to ``src/nvrm/assets/demo-bundle``.

Prints the held-out pairwise accuracy and the wall time. Everything runs on CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from nvrm.cli.main import main as nvrm
from nvrm.prefs.synthetic import PHYSICS
from nvrm.synth.bundles import ArchSpec, build_tiny_bundle

DEMO_BASE = ArchSpec.from_name("tiny", seed=7, rope_theta=100.0)
TASK = dict(train=260, eval=30, seed=0)  # 16 rejected kinds per example (prefs/synthetic.py)
TRAIN = ["--epochs", "2", "--batch-pairs", "8", "--lr", "1e-3", "--eval-every", "200"]
PHYSICS_COPIES = 2
"""Each broken-motion pair appears this often in training."""
SUBTLE = ("shift", "stutter", "blur", "shuffle")
"""Degradations that a few examples do not teach: every training example keeps them."""
OTHERS_PER_EXAMPLE = 2
"""Of the remaining kinds (the obvious degradations, the mismatches), each training example keeps this many, at seeded random."""
ASSET = Path(__file__).resolve().parents[1] / "src" / "nvrm" / "assets" / "demo-bundle"


def training_mix(pairs: Path, out: Path) -> int:
    """Per example: every broken-motion pair PHYSICS_COPIES times, the SUBTLE pairs, and OTHERS_PER_EXAMPLE more.

    The obvious kinds (noise, letterbox, a static image ...) are learnt from few examples; spending
    the step budget on the motion kinds keeps the rebuild short. Held-out evaluation uses all kinds.
    """
    rows = [json.loads(line) for line in pairs.read_text().splitlines()]
    by_example: dict[str, list[dict]] = {}
    for row in rows:
        by_example.setdefault(row["id"].rsplit("-", 1)[0], []).append(row)
    rng = random.Random(0)
    keep = []
    for stem, group in by_example.items():
        physics = [r for r in group if r["kind"] in PHYSICS]
        subtle = [r for r in group if r["kind"] in SUBTLE]
        others = [r for r in group if r["kind"] not in PHYSICS + SUBTLE]
        keep += [dict(r, id=f"{r['id']}#{k}") for r in physics for k in range(PHYSICS_COPIES)]
        keep += subtle + rng.sample(others, min(OTHERS_PER_EXAMPLE, len(others)))
    rng.shuffle(keep)
    out.write_text("".join(json.dumps(r) + "\n" for r in keep))
    return len(keep)


def run() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", help="working folder (default: a temporary one)")
    ap.add_argument("--install", action="store_true", help="copy the result into the package")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="nvrm-demo-train."))
    t0 = time.perf_counter()
    base = build_tiny_bundle(work / "base", DEMO_BASE, revision="nvrm-demo-base-1", label="random base for the nvrm demo model")
    nvrm(["prefs", "synth", "--out", str(work / "task"), "--train", str(TASK["train"]), "--eval", str(TASK["eval"]), "--seed", str(TASK["seed"])])
    mix = training_mix(work / "task/train_pairs.jsonl", work / "task/train_mix.jsonl")
    print(f"training mix: {mix} pairs", file=sys.stderr)
    rc = nvrm(["train", "--base", str(base), "--pairs", str(work / "task/train_mix.jsonl"), "--eval-pairs",
               str(work / "task/eval_pairs.jsonl"), "--output", str(work / "run"), *TRAIN])
    print(f"wall time (base + task + training + export check): {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if rc == 0 and args.install:
        shutil.rmtree(ASSET, ignore_errors=True)
        shutil.copytree(work / "run" / "bundle", ASSET)
        print(f"installed {ASSET}")
    return rc


if __name__ == "__main__":
    sys.exit(run())
