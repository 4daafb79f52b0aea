"""``nvrm rank``: candidates of one context, best first (optionally an HTML report)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import InputError
from .model_flags import add_model_args, load_model
from .options import check_outputs


def add_rank_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm rank``: model loading, prompt, context, the candidates, and the HTML/JSON outputs."""
    add_model_args(p)
    p.add_argument("--prompt", required=True, help="text prompt")
    p.add_argument("--context", required=True, help="preceding video (or image) file")
    p.add_argument("candidates", nargs="+", metavar="CANDIDATE", help="candidate continuation files")
    p.add_argument("--html", metavar="PATH", help="write a self-contained HTML report here")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_rank(args: argparse.Namespace) -> int:
    """Score the candidates as one group and print them best first with Bradley-Terry preference probabilities. Returns 0."""
    from ..report.ranking import pairwise_matrix, rank_rewards

    if args.html and not Path(args.html).resolve().parent.is_dir():
        raise InputError(args.html, "folder for the HTML report does not exist")
    check_outputs({"--context": args.context, "CANDIDATE": args.candidates}, {"--html": args.html})
    model = load_model(args)
    jobs = [model.engine.submit_video(c, "candidate") for c in args.candidates]
    context = model.prepare_video(args.context, "context")
    cands = [f.result() for f in jobs]
    results = model.score_group(args.prompt, context, cands)
    rewards = [r.reward for r in results]
    ranked = rank_rewards(rewards)
    if args.html:
        from ..report.html import render_rank_report

        page = render_rank_report(
            args.prompt, context, cands, rewards, names=[args.context, *args.candidates], model_info=model.info()
        )
        Path(args.html).write_text(page, encoding="utf-8")
    if args.json:
        print(
            json.dumps(
                {
                    "ranking": [
                        {
                            "rank": r.rank,
                            "index": r.index,
                            "candidate": args.candidates[r.index],
                            "reward": r.reward,
                            "p_top": r.p_top,
                            "p_best_over": r.p_best_over,
                            **({"uncertainty": results[r.index].uncertainty} if results[r.index].uncertainty is not None else {}),
                        }
                        for r in ranked
                    ],
                    "pairwise": pairwise_matrix(rewards),
                    "contract": model.fingerprint,
                    "model_revision": model.revision,
                    "html": args.html,
                },
                ensure_ascii=False,
            )
        )
        return 0
    guarded = model.guard is not None
    print(f"{'rank':>4}  {'reward':>10}  {'P(top)':>7}  {'P(#1>this)':>10}  {'uncertainty  ' if guarded else ''}candidate")
    for r in ranked:
        p = "-" if r.rank == 1 else f"{r.p_best_over:.3f}"
        u = f"{results[r.index].uncertainty:>11.4f}  " if guarded else ""
        print(f"{r.rank:>4}  {r.reward:>+10.5f}  {r.p_top:>7.3f}  {p:>10}  {u}{args.candidates[r.index]}")
    if args.html:
        print(f"report: {args.html}")
    return 0
