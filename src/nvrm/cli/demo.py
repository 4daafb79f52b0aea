"""``nvrm demo``: rank sample continuations of one context clip.

Without ``--model`` it uses the embedded demo model shipped in the package
(``nvrm/assets/demo-bundle``): a tiny reward model in the exact release layout,
trained with ``nvrm train`` on the synthetic moving-square task
(``scripts/train_demo_bundle.py`` rebuilds it). Its rewards judge motion
continuity in that toy world, not real video.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


from ..bundle import cache_dir
from ..errors import BundleError

DEMO_LABEL = (
    "DEMO MODEL: a tiny reward model trained on the synthetic moving-square task; "
    "it judges motion continuity in that toy world, not real video"
)


DEMO_PROMPT = "A square glides across a tiled floor at constant speed."
"""The prompt the demo scores its clips with."""

def demo_bundle_path() -> Path:
    """Where the embedded demo bundle lives inside the installed package."""
    return Path(__file__).resolve().parents[1] / "assets" / "demo-bundle"


def ensure_demo_bundle() -> Path:
    """The embedded trained demo bundle (verified like any bundle when loaded)."""
    path = demo_bundle_path()
    if not (path / "RELEASE_MANIFEST.json").is_file():
        raise BundleError(f"{path}: the embedded demo bundle is missing; reinstall nvrm or pass --model DIR")
    return path


def write_demo_clips(folder: Path, seed: int = 424242) -> tuple[Path, dict[str, Path]]:
    """One held-out synthetic example: a 3 s context and five 5 s continuations."""
    from ..prefs.synthetic import SynthSpec, make_example
    from ..synth.clips import write_video

    folder.mkdir(parents=True, exist_ok=True)
    spec = SynthSpec()
    ex = make_example(seed, spec)
    context = write_video(folder / "context.mp4", ex["context"], spec.fps, options={"crf": "18"})
    names = {"preferred": "smooth", "freeze": "frozen", "teleport": "teleport", "reverse": "reversed", "flicker": "flicker"}
    return context, {
        label: write_video(folder / f"candidate_{label}.mp4", ex[key], spec.fps, options={"crf": "18"})
        for key, label in names.items()
    }


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm demo``: an optional bundle (default: the embedded demo), device, prompt and ``--json``."""
    p.add_argument("--model", help="bundle directory; default: the embedded demo bundle")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--prompt", default=DEMO_PROMPT, help="text prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    """Write the demo clips, score and rank them, and print the ranking. Returns 0."""
    from ..scoring.reward_model import RewardModel

    demo = args.model is None
    bundle = ensure_demo_bundle() if demo else Path(args.model)
    model = RewardModel.from_pretrained(bundle, device=args.device)
    context, candidates = write_demo_clips(cache_dir() / "demo-clips-v2")
    names = list(candidates)
    ranking = model.rank(args.prompt, context, [candidates[n] for n in names])
    rows = [{"candidate": names[e.index], "rank": e.rank, "reward": e.reward,
             **({"uncertainty": e.result.uncertainty} if e.result.uncertainty is not None else {})} for e in ranking]
    if args.json:
        print(json.dumps({"demo_weights": demo, "bundle": str(bundle), "contract": model.fingerprint, "results": rows}))
        return 0
    if demo:
        print(f"*** {DEMO_LABEL} ***")
    print(f"bundle   {bundle}")
    print(f"context  {context}")
    print(f"prompt   {args.prompt}")
    print(f"contract {model.fingerprint[:12]}")
    guarded = model.guard is not None
    print(f"{'rank':>4}  {'reward':>10}  {'uncertainty  ' if guarded else ''}candidate")
    for r in rows:
        u = f"{r['uncertainty']:>11.4f}  " if guarded else ""
        print(f"{r['rank']:>4}  {r['reward']:>+10.5f}  {u}{r['candidate']}")
    if guarded:
        print("uncertainty: the part of each reward the bundle's guard puts in doubt (reward units; nvrm guard show)")
    return 0
