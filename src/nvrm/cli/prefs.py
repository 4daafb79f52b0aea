"""nvrm prefs: pairs to judge, judgments, filtered preference pairs, the synthetic task, or a prepared store for training."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import InputError


def add_prefs_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm prefs``: the ``pairs``, ``judge``, ``filter``, ``synth`` and ``prepare`` subcommands."""
    sub = p.add_subparsers(dest="prefs_command", required=True, metavar="ACTION")
    f = sub.add_parser("filter", help="judgments -> order-consistent, acyclic, de-duplicated pairs")
    f.add_argument("--input", required=True, help="judgments.jsonl: prompt, context, first, second, winner (first|second|tie)")
    f.add_argument("--output", required=True, help="pairs.jsonl to write")
    f.add_argument("--removed", help="also write every removed judgment/pair with its reason (JSONL)")
    f.add_argument("--require-judges", type=int, default=1, metavar="N",
                   help="keep a pair only when at least N judges judged it in both orders (and every judgment agrees)")
    f.set_defaults(run=run_filter)
    s = sub.add_parser("synth", help="write the synthetic moving-square preference task")
    s.add_argument("--out", required=True, help="folder for clips/, train_pairs.jsonl, eval_pairs.jsonl")
    s.add_argument("--train", type=int, default=80, help="training examples (one pair per rejected variant each)")
    s.add_argument("--eval", type=int, default=20, help="held-out examples (one pair per rejected variant each)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--variants", help="comma-separated rejected kinds to write (default: all of them; see prefs/synthetic.py)")
    s.set_defaults(run=run_synth)
    add_prepare_args(sub.add_parser(
        "prepare", help="run every video of pairs files once through the contract into a prepared-input store (for nvrm train --store)"))
    from .judge import add_judge_args, add_pairs_args

    add_pairs_args(sub.add_parser("pairs", help="rollouts (N candidates per context) -> the pairs to judge: all, k per context, or the least certain"))
    add_judge_args(sub.add_parser("judge", help="ask vision-language judges (or a reward model) about every pair in both orders: judgments for filter"))


def add_prepare_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm prefs prepare``: the model's, the pairs files, the store and the Ray options."""
    from .model_flags import add_model_args
    from .options import add_ray_args

    add_model_args(p)
    p.add_argument("--pairs", required=True, action="append", help="pairs.jsonl whose videos to prepare (repeatable: training and held-out files)")
    p.add_argument("--store", required=True, help="the store folder (created; a rebuild skips what is stored: resumable)")
    ray = add_ray_args(p, what="preparation tasks on one machine or a cluster", replica="preparation as Ray Data tasks, each writing its own shards")
    ray.add_argument("--cpus-per-task", type=float, default=1.0, help="CPUs reserved per preparation task")
    ray.add_argument("--videos-per-task", type=int, default=32, help="videos one task prepares (one shard each)")
    p.set_defaults(run=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    """``nvrm prefs prepare``: :func:`nvrm.train.prepare_store`; failures are listed, one line each. Returns 0."""
    from ..train import RayStore, prepare_store
    from .model_flags import settings_from_args

    ray = RayStore(args.ray_address, args.cpus_per_task, args.videos_per_task) if args.ray else None
    built = prepare_store(args.model, args.pairs, args.store, settings=None if args.ray else settings_from_args(args), ray=ray)
    for path, role, message in built.failures[:20]:
        print(f"nvrm prefs prepare: skipped {role} {path}: {message}", file=sys.stderr)
    if built.failed > 20:
        print(f"  ... {built.failed - 20} more failed", file=sys.stderr)
    rate = built.stored / built.seconds if built.seconds > 0 else 0.0
    print(f"nvrm prefs prepare: {args.store}: {built.stored} videos prepared ({rate:.1f}/s), {built.skipped} already stored, "
          f"{built.failed} failed, of {built.videos}")
    return 0


def run_filter(args: argparse.Namespace) -> int:
    """Clean a judgments file (drop malformed rows, duplicates, one-order-only and inconsistent judgments, cycles) and write the kept pairs. Returns 0."""
    from ..prefs.filter import filter_judgments
    from .options import check_outputs

    path = Path(args.input)
    if not path.is_file():
        raise InputError(str(path), "judgments file not found")
    check_outputs({"--input": path}, {"--output": args.output, "--removed": args.removed})
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(str(path), f"cannot read judgments file ({e.strerror})") from e
    rows = []
    for n, data in enumerate(raw.splitlines(), start=1):
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as e:  # this row is malformed; the rest of the file is read
            rows.append({"_line": n, "_error": f"not UTF-8 text ({e.reason} at byte {e.start})"})
            continue
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            rows.append({"_line": n, "_error": f"not valid JSON ({e.msg})"})
    if args.require_judges < 1:
        raise InputError(f"--require-judges {args.require_judges}", "must be at least 1")
    result = filter_judgments(rows, require_judges=args.require_judges)
    Path(args.output).write_text("".join(json.dumps(p) + "\n" for p in result.pairs))
    if args.removed:
        Path(args.removed).write_text(
            "".join(json.dumps({"reason": r.reason, "detail": r.detail, "item": r.item}, default=str) + "\n" for r in result.removed)
        )
    counts = result.counts()
    print(f"nvrm prefs filter: {result.judgments} judgments -> {len(result.pairs)} pairs written to {args.output}")
    for reason in ("unjudged", "malformed", "duplicate", "one_order_only", "too_few_judges", "inconsistent", "judges_disagree", "cycle"):
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
