"""The stages of a refresh cycle (``cycle.run_cycle`` calls them in order): each reads the stage before it's
files, writes its own in its folder and returns the digest of what it wrote (``done.json``'s ``output``).

File by stage: ``record/rollouts.jsonl`` (+ ``record/media/``: each recorded frames file once as a video),
``pairs/pairs.jsonl``, ``judge/judgments.jsonl`` (a journal), ``filter/pairs.jsonl``, ``split/train.jsonl`` and
``split/holdout.jsonl``, ``train/run/`` (checkpoints and ``run/bundle``), ``gate/gate.json`` + ``gate.html``,
``export/export.json`` (+ the bundle).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError, RefreshError
from . import plan as P


def bundle_digest(bundle: Path) -> str:
    """A bundle's identity for the fingerprints: its files' names and sizes, and its small JSON files' contents."""
    if not bundle.is_dir():
        raise InputError(str(bundle), "is not a bundle folder (--from)")
    listing = []
    for p in sorted(bundle.rglob("*")):
        if p.is_file():
            small = p.suffix == ".json" and p.stat().st_size < 1 << 20
            listing.append([str(p.relative_to(bundle)), p.stat().st_size, p.read_text(errors="replace") if small else None])
    return P.digest(listing)


def _jsonl(path: Path, rows: list[dict]) -> str:
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    path.write_text(text)
    return P.digest(text)


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _as_video(root: Path, ref: dict, media: Path) -> str:
    """A recorded frames file as a lossless-ish H.264 video at the rate its sample times imply (written once per key)."""
    from ..record.reader import load_frames
    from ..synth.clips import write_video

    out = media / f"{ref['key']}.mp4"
    if not out.is_file():
        times = [float(t) for t in ref.get("times") or []]
        steps = sorted(b - a for a, b in zip(times, times[1:]) if b > a)
        fps = 1.0 / steps[len(steps) // 2] if steps else 1.0
        tmp = out.with_suffix(".part.mp4")
        write_video(tmp, load_frames(root, ref), fps, options={"crf": "0"})
        tmp.replace(out)
    return str(out)


def stage_record(cycle, sub: Path) -> str:
    """A snapshot of the record's request groups (two or more distinct candidates) as rollouts with their rewards."""
    from ..record.reader import iter_groups, open_record, read_rows, skipped_rows

    root = open_record(cycle.record)
    rows, bad = read_rows(root)  # rows that cannot be used (no prompt, a reward that is no finite number, a path leading out) are counted
    problems = [summary] if (summary := skipped_rows(bad, len(rows))) else []
    media = sub / "media"
    media.mkdir(parents=True, exist_ok=True)
    out = []
    for gid, members in iter_groups(rows):
        seen, kept = set(), []
        for r in members:
            key = r["candidate"].get("key")
            if key in seen or not (root / str(r["candidate"].get("path"))).is_file():
                continue
            seen.add(key)
            kept.append(r)
        ctx = members[0].get("context")
        if len(kept) < 2 or not isinstance(ctx, dict) or not (root / str(ctx.get("path"))).is_file():
            problems.append(f"group {gid}: not usable (a context and two distinct candidates are needed)")
            continue
        out.append({"id": gid, "prompt": str(members[0]["prompt"]), "context": _as_video(root, ctx, media),
                    "candidates": [_as_video(root, r["candidate"], media) for r in kept],
                    "rewards": [float(r["reward"]) for r in kept], "revisions": [str(r.get("revision")) for r in kept]})
        doubts = [_uncertainty(r) for r in kept]
        if any(u is not None for u in doubts):  # recorded by a guarded model (without one the snapshot is as before)
            out[-1]["uncertainties"] = doubts
    for line in problems[:10]:
        cycle.say(f"nvrm refresh: record: skipped {line}")
    if not out:
        raise InputError(str(cycle.record), "has no request group with a context and two distinct candidates; nothing to refresh from")
    cycle.say(f"nvrm refresh: record: {len(out)} groups, {sum(len(r['candidates']) for r in out)} candidates")
    return _jsonl(sub / "rollouts.jsonl", out)


def _uncertainty(row: dict) -> float | None:
    u = row.get("uncertainty")
    return float(u) if isinstance(u, (int, float)) and not isinstance(u, bool) and math.isfinite(u) and u >= 0 else None


def _active_pairs(cycle, rollouts: list[dict]) -> list[dict]:
    """--strategy active: the --pairs-per-cycle most informative pairs over the whole record (``nvrm.prefs.active``)."""
    from ..prefs.active import active_pair_rows
    from ..prefs.pairing import Rollout

    ros = [Rollout(r["id"], r["prompt"], r["context"], tuple(r["candidates"]), 0) for r in rollouts]
    rows, plan = active_pair_rows(ros, {r["id"]: r["rewards"] for r in rollouts}, {r["id"]: r.get("uncertainties") or [] for r in rollouts},
                                  cycle.config.pairs_per_cycle)
    if plan.note:
        cycle.say(f"nvrm refresh: pairs: --strategy active: {plan.note}")
    return rows


def stage_pairs(cycle, sub: Path) -> str:
    """The pairs to judge: within each request group, the least certain (smallest recorded gap) or all, or the most informative
    over the whole record (active), up to --pairs-per-cycle."""
    from ..prefs.pairing import Rollout, choose_pairs, pair_rows

    rollouts = _read_jsonl(cycle.root / "record" / "rollouts.jsonl")
    limit = cycle.config.pairs_per_cycle
    if cycle.config.strategy == "active":
        rows = _active_pairs(cycle, rollouts)
        cycle.say(f"nvrm refresh: pairs: {len(rows)} pairs (active, most informative first) from {len(rollouts)} groups")
        return _jsonl(sub / "pairs.jsonl", rows)
    per_group = max(1, math.ceil(limit / len(rollouts)))
    rows = []
    for r in rollouts:
        ro = Rollout(r["id"], r["prompt"], r["context"], tuple(r["candidates"]), 0)
        strategy = "uncertain" if cycle.config.strategy == "least-certain" else "all"
        rows += pair_rows(ro, choose_pairs(len(ro.candidates), strategy, k=per_group, rewards=r["rewards"]), r["rewards"])
    if cycle.config.strategy == "least-certain":
        keep = set(P.pick_least_certain([(row["rewards"][0] - row["rewards"][1], row["pair_id"]) for row in rows], limit))
    else:
        keep = {row["pair_id"] for row in rows[:limit]}
    rows = [row for row in rows if row["pair_id"] in keep]
    cycle.say(f"nvrm refresh: pairs: {len(rows)} pairs ({cycle.config.strategy}) from {len(rollouts)} groups")
    return _jsonl(sub / "pairs.jsonl", rows)


def build_judges(specs: list[str], settings) -> dict:
    """The judges ``--judge`` names (as ``nvrm prefs judge`` takes them), each checked to be reachable."""
    from ..prefs.judges import ChatJudge, JudgeSpec, RewardJudge, reachable

    parsed = [JudgeSpec.parse(text, settings.api_key_env) for text in specs]
    names = [s.name for s in parsed]
    if len(set(names)) < len(names):
        raise ConfigError(f"--judge: two judges are named {sorted(n for n in names if names.count(n) > 1)[0]}; give each name=...")
    judges = {}
    for spec in parsed:
        if spec.url and (why := reachable(spec.url)):
            raise InputError(f"--judge {spec.name}", f"the judge at {spec.url} cannot be reached ({why}); start it or fix the URL")
        judges[spec.name] = (ChatJudge(spec, timeout_s=settings.timeout_s, retries=settings.retries, structured=settings.structured,
                                       logprobs=settings.logprobs, max_tokens=settings.max_tokens, concurrency=settings.concurrency,
                                       max_answer_kb=settings.max_answer_kb) if spec.kind == "chat" else RewardJudge(spec))
    return judges


def stage_judge(cycle, sub: Path) -> str:
    """Every pair asked of every judge in both orders, into a journal a rerun continues (``nvrm prefs judge``)."""
    from ..batch.journal import Journal
    from ..prefs.judging import JudgingRun, journal_check, plan, read_pairs_to_judge

    pairs, problems = read_pairs_to_judge(cycle.root / "pairs" / "pairs.jsonl")
    judges = build_judges(list(cycle.judges), cycle.judging)
    with Journal(sub / "judgments.jsonl", what="judgments file") as journal:
        rows = journal.rows(journal_check(judges, cycle.rubric, cycle.contract))
        done = {(str(r["pair_id"]), str(r["order"]), str(r["judge"])) for r in rows}
        tally = asyncio.run(JudgingRun(judges, cycle.rubric, cycle.contract, journal, cycle.judging).run(plan(pairs, judges, done)))
        rows = journal.rows()
    if tally.not_made:
        why = "; ".join(f"{n} x {w}" for w, n in sorted(tally.reasons.items(), key=lambda kv: -kv[1])[:3])
        raise RefreshError(f"judge: {tally.not_made} judgment(s) could not be made this time ({why}); run nvrm refresh again to resume")
    cycle.say(f"nvrm refresh: judge: {len(rows)} judgments ({tally.written} new, {tally.failed} failed), {len(problems)} pairs skipped")
    return P.digest(sorted([str(r["pair_id"]), str(r["order"]), str(r["judge"]), r.get("winner")] for r in rows))


def stage_filter(cycle, sub: Path) -> str:
    """Order-consistent, acyclic, de-duplicated pairs (``nvrm prefs filter``)."""
    from ..prefs.filter import filter_judgments

    rows = _read_jsonl(cycle.root / "judge" / "judgments.jsonl")  # in a canonical order: a resumed journal's order is not the same
    rows.sort(key=lambda r: (str(r.get("pair_id")), str(r.get("judge")), str(r.get("order"))))
    result = filter_judgments(rows, require_judges=cycle.config.require_judges)
    _jsonl(sub / "removed.jsonl", [{"reason": r.reason, "detail": r.detail} for r in result.removed])
    cycle.say(f"nvrm refresh: filter: {result.judgments} judgments -> {len(result.pairs)} pairs")
    pairs = sorted(result.pairs, key=lambda p: (p["prompt"], p["context"], p["chosen"], p["rejected"]))
    return _jsonl(sub / "pairs.jsonl", pairs)


def stage_split(cycle, sub: Path) -> str:
    """Whole contexts held out for the gate (about --holdout of the pairs); the rest trains."""
    pairs = _read_jsonl(cycle.root / "filter" / "pairs.jsonl")

    def group(p: dict) -> str:  # the context by its content key (its file name), not by where this cycle folder is
        return f"{p['prompt']}\x00{Path(p['context']).name}"

    groups: dict[str, int] = {}
    for p in pairs:
        groups[group(p)] = groups.get(group(p), 0) + 1
    held = P.holdout_split(list(groups), list(groups.values()), cycle.config.holdout)
    train = [p for p in pairs if group(p) not in held]
    holdout = [p for p in pairs if group(p) in held]
    if not holdout or not train:
        raise RefreshError(f"split: {len(pairs)} judged pairs in {len(groups)} context(s): too few to hold some out and train on the rest; "
                           "record more, or raise --pairs-per-cycle")
    cycle.say(f"nvrm refresh: split: {len(train)} pairs train, {len(holdout)} held out ({len(held)} of {len(groups)} contexts)")
    return P.digest([_jsonl(sub / "train.jsonl", train), _jsonl(sub / "holdout.jsonl", holdout)])


def stage_train(cycle, sub: Path) -> str:
    """A LoRA fine-tuned from ``--from`` on the cycle's training pairs, through a prepared-input store (``nvrm.train.fit``),
    continued from its latest checkpoint when the cycle resumes; DDP when launched so."""
    from ..train.fit import fit

    split = cycle.root / "split"
    try:  # finished before the cycle was killed (fit writes summary.json last, after the bundle): nothing to redo
        done = json.loads((sub / "run" / "summary.json").read_text())
        if not done.get("stopped_early") and done.get("bundle") and (Path(done["bundle"]) / "RELEASE_MANIFEST.json").is_file():
            cycle.say("nvrm refresh: train: finished already (run/summary.json); kept")
            return P.digest({"revision": done["revision"], "bundle": done["bundle"]})
    except (OSError, ValueError, KeyError):
        pass
    summary = fit(cycle.base, split / "train.jsonl", sub / "run", cycle.train, eval_pairs=split / "holdout.jsonl",
                  store=sub / "store", resume=True, device=cycle.device)
    if summary.stopped_early or not summary.bundle:
        raise RefreshError("train: stopped at a checkpoint before the end (stop_after_steps or a signal); "
                           "run nvrm refresh again to continue")
    return P.digest({"revision": summary.revision, "bundle": summary.bundle})


def probe_items(cycle) -> list[tuple[str, str, str]]:
    """What the gate probes: up to --probe-contexts of the record's contexts (held-out ones first, then by group id), each with
    the candidate its recorded reward ranked first (where the policy is heading)."""
    n = cycle.config.probe_contexts
    if n == 0:
        return []
    held = {Path(p["context"]).name for p in _read_jsonl(cycle.root / "split" / "holdout.jsonl")}
    rollouts = sorted(_read_jsonl(cycle.root / "record" / "rollouts.jsonl"), key=lambda r: (Path(r["context"]).name not in held, r["id"]))
    items, seen = [], set()
    for r in rollouts:
        if r["context"] in seen:
            continue
        seen.add(r["context"])
        best = max(range(len(r["candidates"])), key=lambda i: r["rewards"][i])
        items.append((r["prompt"], r["context"], r["candidates"][best]))
    return items[:n]


def stage_gate(cycle, sub: Path) -> str:
    """The gate's report, written whether it passes or not (``gate``)."""
    from .gate import run_gate, write_report

    names = [n.strip() for n in cycle.config.probe_perturbations.split(",") if n.strip()] or None
    report = run_gate(cycle.base, cycle.root / "train" / "run" / "bundle", cycle.root / "split" / "holdout.jsonl",
                      anchor_pairs=cycle.anchor_pairs, max_anchor_drop=cycle.config.max_anchor_drop, device=cycle.device,
                      dtype=cycle.train.dtype, probe_items=probe_items(cycle), probe_perturbations=names,
                      probe_flag_share=cycle.config.probe_flag_share)
    write_report(report, sub)
    return P.digest(report)


def stage_export(cycle, sub: Path) -> str | None:
    """The candidate bundle copied to ``--export`` (default ``FOLDER/export/bundle``) when the gate passed; None otherwise."""
    report: dict[str, Any] = json.loads((cycle.root / "gate" / "gate.json").read_text())
    if not report["passed"]:
        return None

    source = cycle.root / "train" / "run" / "bundle"
    target = cycle.export_to or sub / "bundle"
    mine = target.is_dir() and bundle_digest(target) == bundle_digest(source)  # exported by this cycle before it was killed
    if not mine and target.exists() and (not target.is_dir() or any(target.iterdir())):  # never replaced: it may be the user's
        raise InputError(str(target), "already exists (--export); remove it or name a new folder, then run nvrm refresh again")
    if not mine:
        partial = target.with_name(f".{target.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial)
        if target.is_dir():
            target.rmdir()  # empty (checked above)
        partial.replace(target)  # a bundle appears whole or not at all (nvrm serve --watch may be looking)
    (sub / "export.json").write_text(json.dumps({"bundle": str(target)}) + "\n")
    return P.digest({"bundle": str(target), "gate": report["checks"]})


RUN = {"record": stage_record, "pairs": stage_pairs, "judge": stage_judge, "filter": stage_filter, "split": stage_split,
       "train": stage_train, "gate": stage_gate, "export": stage_export}
"""The function of each stage of ``plan.STAGES``."""
