"""nvrm train and nvrm prefs (filter, synth)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import InputError


def add_train_args(p: argparse.ArgumentParser) -> None:
    from ..train.config import TrainConfig

    d = TrainConfig()
    p.add_argument("--base", required=True, help="base bundle to fine-tune (release layout)")
    p.add_argument("--pairs", required=True, help="training pairs.jsonl (prompt, context, chosen, rejected[, tie])")
    p.add_argument("--output", required=True, help="folder for checkpoints, metrics.jsonl and the exported bundle (OUTPUT/bundle)")
    p.add_argument("--eval-pairs", help="held-out pairs, evaluated every epoch (or --eval-every steps)")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr, help="LoRA learning rate")
    p.add_argument("--head-lr", type=float, default=None, help="reward-head learning rate (default: --lr)")
    p.add_argument("--batch-pairs", type=int, default=d.batch_pairs, help="pairs per micro-batch")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-batches per optimizer step")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--lora-rank", type=int, default=d.lora_rank)
    p.add_argument("--lora-alpha", type=float, default=d.lora_alpha)
    p.add_argument("--lora-vision", action="store_true", help="also adapt the vision tower with LoRA")
    p.add_argument("--tie-margin", type=float, default=None, help="Rao-Kupper tie margin tau (default: ln 2 if there are ties)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--save-every", type=int, default=d.save_every, help="optimizer steps between checkpoints")
    p.add_argument("--eval-every", type=int, default=None, help="optimizer steps between evaluations")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="training dtype (default: float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")


def run_train(args: argparse.Namespace) -> int:
    from ..scoring import RewardModel
    from ..train.config import TrainConfig
    from ..train.trainer import Trainer
    from ..report.evaluate import evaluate_pairs

    cfg = TrainConfig(
        epochs=args.epochs, lr=args.lr, head_lr=args.head_lr, batch_pairs=args.batch_pairs, grad_accum=args.grad_accum,
        warmup_steps=args.warmup_steps, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, lora_vision=args.lora_vision, tie_margin=args.tie_margin,
        seed=args.seed, save_every=args.save_every, eval_every=args.eval_every, dtype=args.dtype,
    )
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
    sub = p.add_subparsers(dest="prefs_command", required=True, metavar="ACTION")
    f = sub.add_parser("filter", help="judgments -> order-consistent, acyclic, de-duplicated pairs")
    f.add_argument("--input", required=True, help="judgments.jsonl: prompt, context, first, second, winner (first|second|tie)")
    f.add_argument("--output", required=True, help="pairs.jsonl to write")
    f.add_argument("--removed", help="also write every removed judgment/pair with its reason (JSONL)")
    f.set_defaults(run=run_filter)
    s = sub.add_parser("synth", help="write the synthetic moving-square preference task")
    s.add_argument("--out", required=True, help="folder for clips/, train_pairs.jsonl, eval_pairs.jsonl")
    s.add_argument("--train", type=int, default=80, help="training examples (4 pairs each)")
    s.add_argument("--eval", type=int, default=20, help="held-out examples (4 pairs each)")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(run=run_synth)


def run_filter(args: argparse.Namespace) -> int:
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
    from ..prefs.synthetic import write_task

    files = write_task(args.out, args.train, args.eval, seed=args.seed)
    print(f"nvrm prefs synth: wrote {args.train * 4} training and {args.eval * 4} held-out pairs: {files['train']}, {files['eval']}")
    return 0
