"""nvrm train and nvrm prefs (filter, synth)."""

from __future__ import annotations

import argparse
import json
import sys
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


# ------------------------------------------------------------------ prefs


def add_prefs_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm prefs``: the ``filter`` and ``synth`` subcommands."""
    sub = p.add_subparsers(dest="prefs_command", required=True, metavar="ACTION")
    f = sub.add_parser("filter", help="judgments -> order-consistent, acyclic, de-duplicated pairs")
    f.add_argument("--input", required=True, help="judgments.jsonl: prompt, context, first, second, winner (first|second|tie)")
    f.add_argument("--output", required=True, help="pairs.jsonl to write")
    f.add_argument("--removed", help="also write every removed judgment/pair with its reason (JSONL)")
    f.set_defaults(run=run_filter)
    s = sub.add_parser("synth", help="write the synthetic moving-square preference task")
    s.add_argument("--out", required=True, help="folder for clips/, train_pairs.jsonl, eval_pairs.jsonl")
    s.add_argument("--train", type=int, default=80, help="training examples (one pair per rejected variant each)")
    s.add_argument("--eval", type=int, default=20, help="held-out examples (one pair per rejected variant each)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--variants", help="comma-separated rejected kinds to write (default: all of them; see prefs/synthetic.py)")
    s.set_defaults(run=run_synth)


def run_filter(args: argparse.Namespace) -> int:
    """Clean a judgments file (drop malformed rows, duplicates, one-order-only and inconsistent judgments, cycles) and write the kept pairs. Returns 0."""
    from ..prefs.filter import filter_judgments

    path = Path(args.input)
    if not path.is_file():
        raise InputError(str(path), "judgments file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(str(path), f"judgments file is not UTF-8 text ({e.reason})") from e
    except OSError as e:
        raise InputError(str(path), f"cannot read judgments file ({e.strerror})") from e
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            rows.append({"_line": n, "_error": f"not valid JSON ({e.msg})"})
    result = filter_judgments(rows)
    Path(args.output).write_text("".join(json.dumps(p) + "\n" for p in result.pairs))
    if args.removed:
        Path(args.removed).write_text(
            "".join(json.dumps({"reason": r.reason, "detail": r.detail, "item": r.item}, default=str) + "\n" for r in result.removed)
        )
    counts = result.counts()
    print(f"nvrm prefs filter: {result.judgments} judgments -> {len(result.pairs)} pairs written to {args.output}")
    for reason in ("malformed", "duplicate", "one_order_only", "inconsistent", "cycle"):
        if counts.get(reason):
            print(f"  removed {counts[reason]:>6} {reason.replace('_', ' ')}")
    for r in result.removed[:20]:
        print(f"  - {r.reason}: {r.detail}", file=sys.stderr)
    if len(result.removed) > 20:
        print(f"  ... {len(result.removed) - 20} more (see --removed)", file=sys.stderr)
    return 0


def run_synth(args: argparse.Namespace) -> int:
    """Write a synthetic preference task (clips and pairs) for trying out training. Returns 0."""
    from ..prefs.synthetic import VARIANTS, write_task

    variants = tuple(v.strip() for v in args.variants.split(",")) if args.variants else VARIANTS
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise InputError(f"--variants {args.variants}", f"unknown kind(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(VARIANTS)}")
    if args.train < 0 or args.eval < 0:
        raise InputError(f"--train {args.train} --eval {args.eval}", "example counts cannot be negative")
    files = write_task(args.out, args.train, args.eval, seed=args.seed, variants=variants)
    per = len(variants)
    print(f"nvrm prefs synth: wrote {args.train * per} training and {args.eval * per} held-out pairs: {files['train']}, {files['eval']}")
    return 0
