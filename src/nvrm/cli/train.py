"""nvrm train."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import InputError


def add_train_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm train``: every :class:`TrainConfig` field (generated from the dataclass)."""
    from ..train.config import TrainConfig
    from .options import add_dataclass_args

    p.add_argument("--base", required=True, help="base bundle to fine-tune (release layout)")
    p.add_argument("--pairs", required=True, help="training pairs.jsonl (prompt, context, chosen, rejected[, tie])")
    p.add_argument("--output", required=True, help="folder for checkpoints, metrics.jsonl and the exported bundle (OUTPUT/bundle)")
    p.add_argument("--eval-pairs", help="held-out pairs, evaluated every epoch (or --eval-every steps)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")
    add_dataclass_args(p, TrainConfig, group="training settings")


def run_train(args: argparse.Namespace) -> int:
    """Fine-tune a reward model on pairwise preferences and export a bundle. Returns 0 on success."""
    from ..scoring import RewardModel
    from ..train.config import TrainConfig
    from ..train.trainer import Trainer
    from ..report.evaluate import evaluate_pairs

    from .options import dataclass_from_args

    cfg = dataclass_from_args(args, TrainConfig)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "is a file; --output must be a folder")
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise InputError(str(out), "is not empty; pass --resume to continue a run or choose a new folder")
    out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(args.base, out, cfg, device=args.device)
    train_pairs = trainer.load_pairs(args.pairs, "training")
    eval_pairs = trainer.load_pairs(args.eval_pairs, "eval") if args.eval_pairs else None
    if args.resume:
        trainer.resume()
    run = trainer.train(train_pairs, eval_pairs)
    final_eval = trainer.evaluate(eval_pairs) if eval_pairs else None
    bundle, merged = trainer.export(out / "bundle", args.pairs, args.eval_pairs, {"train": run, "eval_before_export": final_eval})
    # the exported bundle, loaded as any user would, must score like the model that was trained
    loaded = RewardModel.from_pretrained(bundle, device=args.device)
    summary = {"bundle": str(bundle), "revision": merged.revision, "steps": run["steps"], "train_seconds": run["seconds"]}
    if args.eval_pairs:
        from ..pairs import read_pairs
        from ..report.evaluate import summarize

        rows = read_pairs(args.eval_pairs)
        got, _ = evaluate_pairs(loaded, rows)
        want, _ = evaluate_pairs(merged, rows)
        diff = max((abs(a.chosen - b.chosen) + abs(a.rejected - b.rejected) for a, b in zip(got, want)), default=0.0)
        summary["eval"] = summarize(got)
        summary["export_max_abs_diff"] = diff
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"nvrm train: exported {bundle} (revision {merged.revision}) after {run['steps']} steps in {run['seconds']:.0f} s")
        if "eval" in summary:
            ev = summary["eval"]
            print(f"held-out pairwise accuracy {ev['accuracy']:.4f} over {ev['n']} pairs, mean margin {ev['mean_margin']:+.4f} (exported bundle; max |Δr| vs trained model {summary['export_max_abs_diff']:.3g})")
    return 0
