"""``nvrm eval``: pairwise accuracy on preference pairs, with a plot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import InputError
from .model_flags import add_model_args, load_model
from .options import check_outputs


def add_eval_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm eval``: model loading, the pairs file and where to write the plot."""
    add_model_args(p)
    p.add_argument("--pairs", help="pairs.jsonl (prompt, context, chosen, rejected[, tie])")
    p.add_argument("--judgments", help="judgments.jsonl from nvrm prefs judge: how often the model agrees with each judge's order-consistent "
                                       "verdicts, and the judges with each other")
    p.add_argument("--plot", metavar="PNG", help="where to write the plot (default: PAIRS_STEM.rewards.png here)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_eval(args: argparse.Namespace) -> int:
    """Score every (chosen, rejected) pair, print accuracy and margins and write the plot.

    Failed pairs are reported and skipped; returns 2 only when every pair failed, else 0."""
    from ..prefs.pairs import read_pairs
    from ..report.evaluate import evaluate_pairs, plot_pairs, summarize

    if not args.pairs and not args.judgments:
        raise InputError("nvrm eval", "give --pairs, --judgments or both")
    if not args.pairs:
        return _judgments_only(args)
    pairs = read_pairs(args.pairs)
    plot = Path(args.plot) if args.plot else Path(Path(args.pairs).stem + ".rewards.png")
    if not plot.resolve().parent.is_dir():
        raise InputError(str(plot), "folder for the plot does not exist")
    check_outputs({"--pairs": args.pairs}, {"--plot": plot})
    model = load_model(args)
    outcomes, problems = evaluate_pairs(model, pairs)
    for line in problems:
        print(f"nvrm eval: skipped {line}", file=sys.stderr)
    summary = summarize(outcomes, failed=len(problems))
    plot_pairs(outcomes, plot, title=f"{Path(args.pairs).name}: accuracy {summary['accuracy'] or 0:.3f} (n={summary['n']})")
    summary["plot"] = str(plot)
    summary["contract"] = model.fingerprint
    summary["model_revision"] = model.revision
    if args.judgments:
        summary["judges"] = judge_agreement(model, args.judgments)
    if args.json:
        print(json.dumps(summary))
    else:
        acc = "n/a" if summary["accuracy"] is None else f"{summary['accuracy']:.4f}"
        margin = "n/a" if summary["mean_margin"] is None else f"{summary['mean_margin']:+.4f}"
        print(f"pairwise accuracy {acc} over {summary['n']} preference pairs ({summary['tie_rule']})")
        print(f"mean margin {margin}; ties {summary['n_ties']}; failed {summary['failed']}")
        for side in ("chosen", "rejected"):
            s = summary["rewards"][side]
            if s:
                print(
                    f"{side:>8} reward: mean {s['mean']:+.4f} std {s['std']:.4f} "
                    f"min {s['min']:+.4f} median {s['median']:+.4f} max {s['max']:+.4f}"
                )
        print(f"plot: {plot}")
        if args.judgments:
            print(_judge_lines(summary["judges"]))
    return 0 if outcomes or not problems else 2


def judge_agreement(model, path: str) -> dict:
    """How often ``model`` agrees with each judge's order-consistent verdicts in ``path``, and the judges with each other."""
    from ..prefs.verdict import agreement, judged_pairs
    from ..report.evaluate import evaluate_pairs, summarize

    try:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise InputError(str(path), f"cannot read the judgments ({e})") from e
    rows = [r for r in rows if isinstance(r, dict) and {"pair_id", "first", "second"} <= set(r)]
    out: dict = {"between_judges": agreement(rows), "with_model": {}}
    for judge, pairs in sorted(judged_pairs(rows).items()):
        outcomes, problems = evaluate_pairs(model, pairs)
        s = summarize(outcomes, failed=len(problems))
        out["with_model"][judge] = {"pairs": s["n"], "agreement": s["accuracy"], "ties": s["n_ties"], "failed": s["failed"]}
    return out


def _judge_lines(judges: dict) -> str:
    lines = []
    for judge, a in judges["with_model"].items():
        ag = "n/a" if a["agreement"] is None else f"{a['agreement']:.4f}"
        lines.append(f"agreement with judge {judge}: {ag} over {a['pairs']} order-consistent verdicts ({a['ties']} ties left out, {a['failed']} failed)")
    for both, a in judges["between_judges"]["cross_judge"].items():
        ag = "n/a" if a["agreement"] is None else f"{a['agreement']:.4f}"
        lines.append(f"judges {both} agree on {ag} of {a['pairs']} pairs")
    return "\n".join(lines)


def _judgments_only(args: argparse.Namespace) -> int:
    model = load_model(args)
    judges = judge_agreement(model, args.judgments)
    print(json.dumps({"judges": judges, "contract": model.fingerprint, "model_revision": model.revision}) if args.json else _judge_lines(judges))
    return 0
