"""batch, rank and eval: commands over many clips."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import InputError
from .commands import add_model_args, load_model
from .options import add_ray_args, check_outputs

# ------------------------------------------------------------------ batch


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm batch``: model loading, the job (generated from ``JobSettings``), and the Ray options."""
    from ..jobs.runner import JobSettings
    from .options import add_dataclass_args

    add_model_args(p)
    add_dataclass_args(p, JobSettings, group="job")
    ray = add_ray_args(p, what="scale past one process or machine", replica="a Ray Data pipeline with an actor pool of scorers")
    ray.add_argument("--cpus-per-preprocess", type=float, default=1.0, help="CPUs per preprocessing task")


def run_batch(args: argparse.Namespace) -> int:
    """``nvrm batch``: score a manifest into a durable, resumable output (locally or on Ray). Returns 0, or 1
    when some rows failed for internal reasons (out of memory, a crash) rather than their input."""
    from ..jobs import LocalExecutor, run
    from ..jobs.manifest import read_job_manifest
    from ..jobs.sink import output_format
    from .commands import settings_from_args

    from ..jobs.runner import JobSettings
    from .options import dataclass_from_args

    job = dataclass_from_args(args, JobSettings)
    output_format(Path(job.output))  # refuse an unknown extension before loading the model
    read_job_manifest(job.input)  # and a manifest that cannot be read
    settings = settings_from_args(args)
    common = dict(resume=job.resume, overwrite=job.overwrite, flush_every=job.flush_every)
    if args.ray:
        from ..jobs.ray_runner import RayExecutor, _require_ray

        if args.replicas < 1:
            raise InputError(f"--replicas {args.replicas}", "must be at least 1")
        _require_ray()
        executor = RayExecutor(
            args.model,
            settings=settings,
            address=args.ray_address,
            replicas=args.replicas,
            gpus_per_replica=args.gpus_per_replica,
            cpus_per_preprocess=args.cpus_per_preprocess,
        )
        summary = run(job.input, job.output, executor, **common)
        print(f"nvrm batch (ray, {args.replicas} replica(s)): {summary.line()}")
        return 1 if summary.internal else 0
    from ..scoring import RewardModel

    with RewardModel.from_pretrained(args.model, settings=settings) as model:
        summary = run(job.input, job.output, LocalExecutor(model, batch_rows=job.flush_every), **common)
    print(f"nvrm batch: {summary.line()}")
    return 1 if summary.internal else 0  # every row is written either way; 1 says some need another run


# ------------------------------------------------------------------ rank


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
    print(f"{'rank':>4}  {'reward':>10}  {'P(top)':>7}  {'P(#1>this)':>10}  candidate")
    for r in ranked:
        p = "-" if r.rank == 1 else f"{r.p_best_over:.3f}"
        print(f"{r.rank:>4}  {r.reward:>+10.5f}  {r.p_top:>7.3f}  {p:>10}  {args.candidates[r.index]}")
    if args.html:
        print(f"report: {args.html}")
    return 0


# ------------------------------------------------------------------ eval


def add_eval_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm eval``: model loading, the pairs file and where to write the plot."""
    add_model_args(p)
    p.add_argument("--pairs", required=True, help="pairs.jsonl (prompt, context, chosen, rejected[, tie])")
    p.add_argument("--plot", metavar="PNG", help="where to write the plot (default: PAIRS_STEM.rewards.png here)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_eval(args: argparse.Namespace) -> int:
    """Score every (chosen, rejected) pair, print accuracy and margins and write the plot.

    Failed pairs are reported and skipped; returns 2 only when every pair failed, else 0."""
    from ..pairs import read_pairs
    from ..report.evaluate import evaluate_pairs, plot_pairs, summarize

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
    return 0 if outcomes or not problems else 2
