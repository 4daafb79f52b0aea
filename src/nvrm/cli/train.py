"""``nvrm train``: fine-tune on preference pairs, alone or data-parallel (``torchrun`` / ``accelerate launch``)."""

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
    p.add_argument("--store", help="prepared-input store to train from (built here first when videos are missing: nvrm prefs prepare)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output (at any number of processes)")
    p.add_argument("--device", help="torch device (default: cuda:LOCAL_RANK if available, else cpu)")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")
    add_dataclass_args(p, TrainConfig, group="training settings")


def _check_output(out: Path, resume: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "is a file; --output must be a folder")
    if out.exists() and any(out.iterdir()) and not resume:
        raise InputError(str(out), "is not empty; pass --resume to continue a run or choose a new folder")
    out.mkdir(parents=True, exist_ok=True)


def run_train(args: argparse.Namespace) -> int:
    """Fine-tune a reward model on pairwise preferences and export a bundle (rank 0 writes). Returns 0 on success."""
    from ..train.config import TrainConfig
    from ..train.dist import Ranks
    from ..train.trainer import Trainer
    from .options import dataclass_from_args

    cfg = dataclass_from_args(args, TrainConfig)
    ranks = Ranks.start(args.device)
    out = Path(args.output)
    problem = None
    if ranks.is_main:  # one rank decides about the folder; every rank learns the answer
        try:
            _check_output(out, args.resume)
        except InputError as e:
            problem = e
    ranks.check_all(problem)
    trainer = Trainer(args.base, out, cfg, ranks=ranks, store=args.store)
    if args.store:
        built = trainer.build_store([args.pairs] + ([args.eval_pairs] if args.eval_pairs else []))
        trainer.say(f"nvrm train: store {args.store}: {built['stored']} videos prepared now, {built['skipped']} already there, {built['failed']} failed")
    train_pairs = trainer.load_pairs(args.pairs, "training")
    eval_pairs = trainer.load_pairs(args.eval_pairs, "eval") if args.eval_pairs else None
    if args.resume:
        trainer.resume()
    run = trainer.train(train_pairs, eval_pairs)
    final_eval = trainer.evaluate(eval_pairs) if eval_pairs else None
    digests = ranks.gather(trainer.weights_digest(), to_all=True)
    summary = {"world_size": ranks.world, "steps": run["steps"], "train_seconds": run["seconds"], "weights_in_sync": len(set(digests)) == 1}
    if run["stopped_early"]:
        summary["stopped_early"] = True
    else:
        _refuse_collapsed(final_eval or trainer.evaluate(train_pairs[:16]), "held-out" if final_eval else "training")
        bundle, merged = trainer.export(out / "bundle", args.pairs, args.eval_pairs, {"train": run, "eval_before_export": final_eval})
        if ranks.is_main:
            summary.update(_check_export(bundle, merged, args))
    if ranks.is_main:
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        _report(summary, args)
    ranks.barrier()
    return 0


def _refuse_collapsed(ev: dict, what: str) -> None:
    """No export of a model that gives every candidate one reward (a run that diverged to a constant)."""
    from ..errors import TrainingError

    rewards = (ev.get("rewards") or {}).get("all") or {}
    if ev.get("n", 0) >= 2 and rewards.get("std") == 0:
        raise TrainingError(
            f"the trained model gives every {what} candidate the same reward ({rewards.get('mean')}): it collapsed; no bundle is exported "
            "and the checkpoints are kept (lower --lr and train again)"
        )


def _check_export(bundle: Path, merged, args: argparse.Namespace) -> dict:
    """The exported bundle, loaded as any user would, must score like the model that was trained."""
    from ..report.evaluate import evaluate_pairs, summarize
    from ..scoring.reward_model import RewardModel

    out = {"bundle": str(bundle), "revision": merged.revision}
    if args.eval_pairs:
        from ..prefs.pairs import read_pairs

        loaded = RewardModel.from_pretrained(bundle, device=str(merged.device))
        rows = read_pairs(args.eval_pairs)
        got, _ = evaluate_pairs(loaded, rows)
        want, _ = evaluate_pairs(merged, rows)
        out["eval"] = summarize(got)
        out["export_max_abs_diff"] = max((abs(a.chosen - b.chosen) + abs(a.rejected - b.rejected) for a, b in zip(got, want)), default=0.0)
        loaded.close()
    return out


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
