"""``nvrm prefs pairs`` (rollouts -> the pairs to judge) and ``nvrm prefs judge`` (pairs -> judgments)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from ..errors import ConfigError, InputError


def add_pairs_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm prefs pairs``: the rollouts, the output, the strategy and, for ``uncertain``, the model's."""
    from .model_flags import add_model_args

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--rollouts", help="rollouts.jsonl: id, prompt, context, candidates (N videos per context)")
    src.add_argument("--from-record", metavar="DIR", help="a record of nvrm serve --record (or record=DIR): each request group is a rollout, "
                     "its recorded rewards (and uncertainties) serve --strategy uncertain and active (docs/record.md)")
    p.add_argument("--output", required=True, help="pairs file to write (the input of nvrm prefs judge)")
    p.add_argument("--strategy", choices=("all", "k", "uncertain", "active"), default="all",
                   help="all pairs; k drawn per context; the k a reward model is least sure about (smallest |r_a - r_b|; needs --model "
                        "or a record); or active: the --budget most informative pairs over all contexts, by the guard's uncertainty and "
                        "the Bradley-Terry closeness (docs/record.md)")
    p.add_argument("--k", type=int, default=0, help="pairs per context for --strategy k or uncertain")
    p.add_argument("--budget", type=int, metavar="N", help="--strategy active: the most pairs to judge in all (each is asked in both orders)")
    p.add_argument("--seed", type=int, default=0, help="seed of --strategy k (the same seed draws the same pairs)")
    add_model_args(p, required=False)
    p.set_defaults(run=run_pairs)


def run_pairs(args: argparse.Namespace) -> int:
    """Write the pairs to judge; rollouts that cannot be used (or scored) are listed, one line each. Returns 0, or 2 when none is usable."""
    from ..prefs.pairing import choose_pairs, pair_rows, read_rollouts
    from .options import check_outputs

    rewards: dict[str, list[float]] = {}
    uncertainties: dict[str, list[float | None]] = {}
    if getattr(args, "from_record", None):
        from ..prefs.pairing import record_rollouts

        recorded, problems = record_rollouts(args.from_record)
        rollouts = [r.rollout for r in recorded]
        if not args.model:  # the rewards (and uncertainties) the record kept pick the pairs (a --model scores them again)
            rewards = {r.rollout.id: list(r.rewards) for r in recorded}
            uncertainties = {r.rollout.id: list(r.uncertainties) for r in recorded}
    else:
        check_outputs({"--rollouts": args.rollouts}, {"--output": args.output})
        rollouts, problems = read_rollouts(args.rollouts)
    _check_pair_flags(args)
    if args.strategy in ("uncertain", "active") and not rewards:
        if not args.model:
            raise InputError(f"--strategy {args.strategy}", "needs --model (the reward model whose uncertainty picks the pairs)")
        rollouts = _score_rollouts(args, rollouts, rewards, uncertainties, problems)
    summary = f"({args.strategy})"
    if args.strategy == "active":
        from ..prefs.active import active_pair_rows

        rows, plan = active_pair_rows(rollouts, rewards, uncertainties, args.budget)
        if plan.note:
            print(f"nvrm prefs pairs: --strategy active: {plan.note}", file=sys.stderr)
        summary = f"(active: the {len(rows)} most informative of {plan.pairs}, most informative first)"
    else:
        rows = [row for r in rollouts for row in pair_rows(r, choose_pairs(len(r.candidates), args.strategy, k=args.k, seed=args.seed,
                                                                           rollout_id=r.id, rewards=rewards.get(r.id)), rewards.get(r.id))]
    Path(args.output).write_text("".join(json.dumps(row) + "\n" for row in rows))
    for line in problems:
        print(f"nvrm prefs pairs: skipped {line}", file=sys.stderr)
    print(f"nvrm prefs pairs: {len(rows)} pairs from {len(rollouts)} rollouts {summary} -> {args.output}")
    return 0 if rows or not problems else 2


def _check_pair_flags(args: argparse.Namespace) -> None:
    """--k for the per-context strategies, --budget for active (and only there); one line naming the flag otherwise."""
    if args.strategy in ("k", "uncertain") and args.k < 1:
        raise InputError(f"--k {args.k}", f"--strategy {args.strategy} needs --k of at least 1 pair per context")
    if args.strategy == "active":
        if args.budget is None:
            raise InputError("--strategy active", "needs --budget N: the most pairs to judge over the whole record")
        if args.budget < 1:
            raise InputError(f"--budget {args.budget}", "must be at least 1 pair to judge")
    elif args.budget is not None:
        raise InputError(f"--budget {args.budget}", f"applies to --strategy active only (this is --strategy {args.strategy}; use --k)")


def _score_rollouts(args: argparse.Namespace, rollouts: list, rewards: dict, uncertainties: dict, problems: list[str]) -> list:
    """Score each rollout with --model (one group each): fills ``rewards`` and ``uncertainties`` (None without a guard) and
    returns the rollouts that scored; the others are listed in ``problems``."""
    from .model_flags import load_model

    with load_model(args) as model:
        for r, results in zip(rollouts, model.score_groups(((r.prompt, r.context, list(r.candidates)) for r in rollouts), errors="return")):
            bad = [x for x in results if isinstance(x, BaseException)]
            if bad:
                problems.append(f"rollout {r.id}: not scored ({bad[0]})")
            else:
                rewards[r.id] = [x.reward for x in results]
                uncertainties[r.id] = [getattr(x, "uncertainty", None) for x in results]
    return [r for r in rollouts if r.id in rewards]


def add_judge_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm prefs judge``: pairs, output, judges, rubric, and one flag per ``RunSettings`` and ``JudgeContract`` field."""
    from ..prefs.judge_contract import JudgeContract
    from ..prefs.judging import RunSettings
    from .options import add_dataclass_args

    p.add_argument("--pairs", required=True, help="pairs file from nvrm prefs pairs (pair_id, prompt, context, a, b)")
    p.add_argument("--output", required=True, help="judgments.jsonl: one row per (pair, order, judge); also the journal --resume continues")
    p.add_argument("--judge", action="append", required=True, metavar="SPEC",
                   help="http://host:port/v1 (a chat-completions server), name=N,url=U,model=M,key_env=VAR, nvrm:BUNDLE or nvrm+http://host:port (repeatable)")
    p.add_argument("--rubric", help="rubric template file with {prompt}, {first}, {second} (and optionally {context}); default: nvrm's own")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="ask only what the output lacks")
    again.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_dataclass_args(p, RunSettings, group="requests")
    add_dataclass_args(p, JudgeContract, group="judge contract (what each judge is shown)")
    p.set_defaults(run=run_judge)


def _judges(args: argparse.Namespace, settings) -> dict:
    from ..prefs.judges import ChatJudge, JudgeSpec, RewardJudge, reachable

    specs = [JudgeSpec.parse(text, settings.api_key_env) for text in args.judge]
    names = [s.name for s in specs]
    if len(set(names)) < len(names):
        raise ConfigError(f"--judge: two judges are named {sorted(n for n in names if names.count(n) > 1)[0]}; give each name=...")
    judges = {}
    for spec in specs:
        url = spec.url
        if url and (why := reachable(url)):
            raise InputError(f"--judge {spec.name}", f"the judge at {url} cannot be reached ({why}); start it or fix the URL")
        if spec.kind == "chat":
            judges[spec.name] = ChatJudge(spec, timeout_s=settings.timeout_s, retries=settings.retries, structured=settings.structured,
                                          logprobs=settings.logprobs, max_tokens=settings.max_tokens, concurrency=settings.concurrency,
                                          max_answer_kb=settings.max_answer_kb)
        else:
            judges[spec.name] = RewardJudge(spec)
    return judges


def run_judge(args: argparse.Namespace) -> int:
    """Ask every judge about every pair in both orders. Returns 0 when every judgment is written (verdict, unparsed or
    failed with its reason), 1 when some could not be made this time (--resume asks them again)."""
    from ..batch.journal import Journal
    from ..prefs.judge_contract import JudgeContract, Rubric
    from ..prefs.judging import JudgingRun, RunSettings, journal_check, plan, read_pairs_to_judge, summary
    from .options import check_outputs, dataclass_from_args

    settings = dataclass_from_args(args, RunSettings)
    contract = dataclass_from_args(args, JudgeContract)
    rubric = Rubric.load(args.rubric)
    check_outputs({"--pairs": args.pairs}, {"--output": args.output})
    pairs, problems = read_pairs_to_judge(args.pairs)
    out = Path(args.output)
    if out.exists() and out.stat().st_size and not (args.resume or args.overwrite):
        raise InputError(str(out), "already exists; pass --resume to continue it or --overwrite to start again")
    judges = _judges(args, settings)
    t0 = time.perf_counter()
    with Journal(out, what="judgments file") as journal:
        if args.overwrite:
            journal.replace([])
        rows = journal.rows(journal_check(judges, rubric, contract))
        done = {(str(r["pair_id"]), str(r["order"]), str(r["judge"])) for r in rows if r.get("template_sha256") == rubric.sha256}
        tasks = plan(pairs, judges, done)
        run = JudgingRun(judges, rubric, contract, journal, settings)
        tally = asyncio.run(run.run(tasks))
        rows = journal.rows()
    result = summary(tally, rows, settings, time.perf_counter() - t0)
    result["skipped_pairs"] = len(problems)
    for line in problems[:20] + [f"... {len(problems) - 20} more" for _ in [0] if len(problems) > 20]:
        print(f"nvrm prefs judge: skipped {line}", file=sys.stderr)
    for judge in judges.values():
        for note in judge.notes:
            print(f"nvrm prefs judge: {note}", file=sys.stderr)
    print(json.dumps(result) if args.json else _lines(result, out), file=sys.stdout)
    if tally.not_made:
        reasons = "; ".join(f"{n} x {why}" for why, n in sorted(tally.reasons.items(), key=lambda kv: -kv[1])[:3])
        print(f"nvrm prefs judge: {tally.not_made} judgment(s) could not be made this time ({reasons}); run again with --resume", file=sys.stderr)
        return 1
    return 0


def _lines(result: dict, out: Path) -> str:
    tokens = result["tokens"]
    lines = [f"nvrm prefs judge: {result['written']} judgments written ({result['verdicts']} verdicts, {result['unparsed']} unparsed, "
             f"{result['failed']} failed), {result['not_made']} not made; {result['rows_in_output']} rows in {out} ({result['seconds']:.1f} s)",
             f"  tokens: {tokens['prompt']} prompt, {tokens['completion']} completion"
             + (f" ({tokens['answers_without_usage']} answers without usage from their server)" if tokens["answers_without_usage"] else "")
             + (f"; cost {result['cost']:.4f}" if result["cost"] is not None else "")]
    for judge, a in result["agreement"]["per_judge"].items():
        oc = "n/a" if a["order_consistency"] is None else f"{a['order_consistency']:.3f}"
        lines.append(f"  {judge}: order consistency {oc} over {a['pairs_both_orders']} pairs with a verdict in both orders")
    for both, a in result["agreement"]["cross_judge"].items():
        ag = "n/a" if a["agreement"] is None else f"{a['agreement']:.3f}"
        lines.append(f"  {both}: agreement {ag} over {a['pairs']} pairs both judged consistently")
    return "\n".join(lines)
