"""``nvrm train``: fine-tune on preference pairs, alone or data-parallel (``torchrun`` / ``accelerate launch``)."""

from __future__ import annotations

import argparse
import json


def add_train_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm train``: every :class:`TrainConfig` field (generated from the dataclass)."""
    from ..train.config import TrainConfig
    from .options import add_dataclass_args

    p.add_argument("--base", required=True, help="base bundle to fine-tune (release layout)")
    p.add_argument("--pairs", required=True, help="training pairs.jsonl (prompt, context, chosen, rejected[, tie])")
    p.add_argument("--output", required=True, help="folder for checkpoints, metrics.jsonl and the exported bundle (OUTPUT/bundle)")
    p.add_argument("--eval-pairs", help="held-out pairs, evaluated every epoch (or --eval-every steps)")
    p.add_argument("--store", help="prepared-input store to train from (built here first when videos are missing: nvrm prefs prepare)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output (at any number of processes)")
    p.add_argument("--device", help="torch device (default: cuda:LOCAL_RANK if available, else cpu)")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")
    add_dataclass_args(p, TrainConfig, group="training settings")


def run_train(args: argparse.Namespace) -> int:
    """``nvrm train``: :func:`nvrm.train.fit` with the flags' settings, and its summary printed (rank 0). Returns 0."""
    from ..train import fit
    from ..train.config import TrainConfig
    from .options import dataclass_from_args

    summary = fit(args.base, args.pairs, args.output, dataclass_from_args(args, TrainConfig), eval_pairs=args.eval_pairs,
                  store=args.store, resume=args.resume, device=args.device)
    if summary.rank == 0:
        _report(summary.to_dict(), args)
    return 0


def _report(summary: dict, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(summary))
        return
    if summary.get("stopped_early"):
        print(f"nvrm train: stopped after step {summary['steps']} with a checkpoint; --resume continues")
        return
    print(f"nvrm train: exported {summary['bundle']} (revision {summary['revision']}) after {summary['steps']} steps in {summary['train_seconds']:.0f} s"
          f" on {summary['world_size']} process(es)")
    if "eval" in summary:
        ev = summary["eval"]
        print(f"held-out pairwise accuracy {ev['accuracy']:.4f} over {ev['n']} pairs, mean margin {ev['mean_margin']:+.4f} "
              f"(exported bundle; max |Δr| vs trained model {summary['export_max_abs_diff']:.3g})")
