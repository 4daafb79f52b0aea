"""Fit the embedded demo model's guard and (with --install) put it beside the demo bundle's files.

    .venv/bin/python scripts/fit_demo_guard.py [--work DIR] [--adaptive-rounds N] [--install]

1. writes the synthetic task at a seed the demo model never trained on (``nvrm prefs synth --seed 1``);
   half of its examples' clips are also written as ``.npy`` sampled frames, the raw frames a policy hands
   in (the rest stay H.264), and those examples' pairs name the ``.npy`` files: the guard then knows
   genuine candidates both ways, and an encoding cannot tell it hacked from genuine;
2. ``nvrm guard fit`` on a copy of the demo bundle, without its shipped guard (the attacks, ``--adaptive-rounds``
   rounds, one by default as shipped, a held-out check);
3. with ``--install``, copies ``nvrm_guard.safetensors`` into ``src/nvrm/assets/demo-bundle`` and lists it in
   that bundle's manifest. The demo model's own files are not touched.

Prints the fit's held-out figures and the wall time. Everything runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nvrm.cli.main import main as nvrm

TASK = dict(examples=24, seed=1)
FIT = ["--attacks", "96", "--holdout", "0.2", "--seed", "0"]
ASSET = Path(__file__).resolve().parents[1] / "src" / "nvrm" / "assets" / "demo-bundle"


def with_sampled_files(pairs: Path, out: Path) -> int:
    """``pairs`` with every other example's clips as ``.npy`` sampled frames (written beside them); returns how many were converted."""
    from nvrm.contract import Contract
    from nvrm.video.inputs import sample_input

    contract = Contract()
    rows = [json.loads(line) for line in pairs.read_text().splitlines() if line.strip()]
    examples = sorted({r["id"].rsplit("-", 1)[0] for r in rows})
    raw = set(examples[::2])
    done: dict[str, str] = {}

    def npy(rel: str, role: str) -> str:
        if (rel, role) not in done:
            images, _, _ = sample_input(str(pairs.parent / rel), role, contract)
            target = Path(rel).with_suffix(f".{role}.npy")
            np.save(pairs.parent / target, np.stack([np.asarray(im) for im in images]))
            done[(rel, role)] = str(target)
        return done[(rel, role)]

    for r in rows:
        if r["id"].rsplit("-", 1)[0] in raw:
            for key, role in (("context", "context"), ("chosen", "candidate"), ("rejected", "candidate"), ("rejected_context", "context")):
                if key in r:
                    r[key] = npy(r[key], role)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(done)


def drop_guard(bundle: Path) -> None:
    """The copied bundle without the shipped guard: its file and its manifest entry (the fit writes and lists its own)."""
    (bundle / "nvrm_guard.safetensors").unlink(missing_ok=True)
    manifest = bundle / "RELEASE_MANIFEST.json"
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        files = data.get("files")
        if isinstance(files, dict):
            files.pop("nvrm_guard.safetensors", None)
        elif isinstance(files, list):
            data["files"] = [f for f in files if not (isinstance(f, dict) and f.get("path") == "nvrm_guard.safetensors")]
        manifest.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def run() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", help="working folder (default: a temporary one)")
    ap.add_argument("--install", action="store_true", help="copy the guard into the package's demo bundle")
    ap.add_argument("--adaptive-rounds", type=int, default=1, help="rounds of attackers ascending the conservative reward of the guard so far")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="nvrm-demo-guard."))
    t0 = time.perf_counter()
    nvrm(["prefs", "synth", "--out", str(work / "task"), "--train", str(TASK["examples"]), "--eval", "0", "--seed", str(TASK["seed"])])
    n = with_sampled_files(work / "task/train_pairs.jsonl", work / "task/guard_pairs.jsonl")
    print(f"{n} clips also as .npy sampled frames", file=sys.stderr)
    bundle = work / "demo-bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.copytree(ASSET, bundle)
    drop_guard(bundle)
    fit = [*FIT, "--adaptive-rounds", str(args.adaptive_rounds), "--json"]
    rc = nvrm(["guard", "fit", "--model", str(bundle), "--pairs", str(work / "task/guard_pairs.jsonl"), *fit])
    print(f"wall time (task + fit): {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if rc == 0 and args.install:
        from nvrm.guard import load_guard, write_bundle_guard

        write_bundle_guard(ASSET, load_guard(bundle / "nvrm_guard.safetensors"))
        print(f"installed {ASSET / 'nvrm_guard.safetensors'}")
    return rc


if __name__ == "__main__":
    sys.exit(run())
