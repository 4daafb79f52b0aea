"""``nvrm demo``: score sample continuations of one context clip.

Without ``--model`` it uses the embedded demo bundle: a small random-weight
bundle in the release layout, built locally on first use. Its rewards only
show that the pipeline runs end to end; they carry no preference signal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..bundle import cache_dir

DEMO_VERSION = "v1"
DEMO_LABEL = "DEMO WEIGHTS: random, untrained; rewards show the pipeline runs, not a preference"


def demo_bundle_path() -> Path:
    return cache_dir() / f"demo-bundle-{DEMO_VERSION}"


def ensure_demo_bundle() -> Path:
    """Build the demo bundle once (atomically) and return its path."""
    from ..testing.bundle import TinySpec, build_tiny_bundle

    target = demo_bundle_path()
    if (target / "RELEASE_MANIFEST.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="demo-bundle.", dir=target.parent))
    build_tiny_bundle(tmp, TinySpec(seed=7), revision=f"nvrm-demo-{DEMO_VERSION}", label=f"nvrm demo bundle. {DEMO_LABEL}")
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_demo_clips(folder: Path) -> tuple[Path, dict[str, Path]]:
    """A 10 s context and four 5 s continuations: smooth, frozen, teleporting, reversed."""
    from ..testing.clips import moving_square, write_video

    folder.mkdir(parents=True, exist_ok=True)
    fps, ctx_s, cand_s = 8, 10, 5
    frames = moving_square((ctx_s + cand_s) * fps, 144, 176, seed=3, speed=2.0)
    context = write_video(folder / "context.mp4", frames[: ctx_s * fps], fps)
    cont = frames[ctx_s * fps :]
    rng = np.random.default_rng(0)
    variants = {
        "smooth": cont,
        "frozen": np.repeat(cont[:1], len(cont), axis=0),
        "teleport": cont[rng.permutation(len(cont))],
        "reversed": frames[ctx_s * fps - len(cont) : ctx_s * fps][::-1],
    }
    return context, {name: write_video(folder / f"candidate_{name}.mp4", v, fps) for name, v in variants.items()}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="bundle directory; default: the embedded demo bundle")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--prompt", default="A red square glides across a tiled floor.", help="text prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from ..scoring import RewardModel

    demo = args.model is None
    bundle = ensure_demo_bundle() if demo else Path(args.model)
    model = RewardModel.from_pretrained(bundle, device=args.device)
    context, candidates = write_demo_clips(cache_dir() / "demo-clips")
    names = list(candidates)
    ranking = model.rank(args.prompt, context, [candidates[n] for n in names])
    rows = [{"candidate": names[e.index], "rank": e.rank, "reward": e.reward} for e in ranking]
    if args.json:
        print(json.dumps({"demo_weights": demo, "bundle": str(bundle), "contract": model.contract.fingerprint, "results": rows}))
        return 0
    if demo:
        print(f"*** {DEMO_LABEL} ***")
    print(f"bundle   {bundle}")
    print(f"context  {context}")
    print(f"prompt   {args.prompt}")
    print(f"contract {model.contract.fingerprint[:12]}")
    print(f"{'rank':>4}  {'reward':>10}  candidate")
    for r in rows:
        print(f"{r['rank']:>4}  {r['reward']:>+10.5f}  {r['candidate']}")
    return 0
