"""Active judging on the synthetic task: the refreshed model's gate accuracy against the number of judge calls,
pairs chosen at random or by ``--strategy active`` (``nvrm.prefs.active``: the guard's uncertainty and the
Bradley-Terry closeness).

    .venv/bin/python benchmarks/active_judging.py --out benchmarks/results/active-judging-<machine>.json \\
        --plot docs/img/active-judging.png

1. **The guard.** A copy of the shipped demo bundle (trained on the synthetic task, seed 0) gets a guard fitted by
   ``nvrm.train.fit_guard`` on a separate synthetic split (or the bundle's own ``nvrm_guard.safetensors`` when it has one).
2. **The record**, as an RL run leaves it: ``--groups`` fresh examples, each a group of the preferred continuation,
   ``--genuine`` rejected variants and ``--hacked`` candidates made by signed gradient ascent on the demo model's reward
   (``nvrm.train.ascent.ascend``) from other rejected variants, scored by the guarded model through
   ``make_reward_fn(..., record=DIR)``: each row keeps its reward and uncertainty.
3. **The gate set**: ``--gate-examples`` other fresh examples, the preferred continuation against every rejected
   variant and against ``--gate-hacked`` hacked candidates each (hacked against the demo model, as in the record).
4. **The oracle judge** knows the synthetic truth: the preferred continuation beats every other candidate; two others
   (rejected or hacked) are a tie, which costs the judge call like any other and trains as a tie (Rao-Kupper), as
   ``nvrm prefs filter`` passes a tie judged in both orders.
5. For each strategy and budget (a budget is judged pairs; ``nvrm prefs judge`` asks each in both orders): the pairs
   chosen from the record (``record_rollouts``, as ``nvrm prefs pairs --from-record`` reads it), labelled by the
   oracle, a LoRA trained from the demo bundle (``nvrm.train.fit``), and its accuracy on the gate set (the gate's
   ``evaluate_pairs``). Random selection takes prefixes of one seeded permutation per draw; active selection the
   prefixes of its ranking, trained with as many seeds as random has draws.

Besides the trained curves it counts, for more priorities, how many chosen pairs a judge's verdict corrects (the model
ranks the oracle's loser first): the cheap measure the priority was designed on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

PROMPT = "A square glides across a tiled floor at constant speed."
RECORD_SEED, GATE_SEED, GUARD_SEED = 2_000_000, 3_000_000, 101
REJECTED = ("freeze", "teleport", "reverse", "flicker", "stutter", "shuffle", "shift", "noise", "brightness", "blur", "lowres",
            "letterbox", "static", "copy_context")
"""The rejected variants (nvrm.prefs.synthetic.PHYSICS + DEGRADED)."""
HACK_BUDGETS = (8, 16, 32)
"""L-infinity budgets (0..255 levels) of the hacked candidates; the attacker takes ``--hack-steps`` signed steps of budget/4."""


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def frames_key(frames: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest()


def sampled(model, clip, role: str = "candidate") -> np.ndarray:
    """The contract's sampled frames of ``clip`` (uint8 (T, H, W, 3)): what the record stores and what an attacker moves."""
    from nvrm.video.inputs import sample_input

    images, _, _ = sample_input(clip, role, model.contract, model.limits)
    return np.stack([np.asarray(im) for im in images])


def hack(model, context, starts: list[np.ndarray], rng: random.Random, steps: int) -> list[np.ndarray]:
    """``starts`` ascended on ``model``'s reward, each within a budget drawn from ``HACK_BUDGETS``."""
    from nvrm.train.ascent import Ascent, ascend

    attacks = []
    for _ in starts:
        budget = rng.choice(HACK_BUDGETS) / 255.0
        attacks.append(Ascent(budget, budget / 4, steps))
    return ascend(model, PROMPT, context, starts, model.contract.sample_fps, attacks)


def example_candidates(model, seed: int, genuine: list[str], hacked: list[str], steps: int, rng: random.Random):
    """(context clip, [(kind, variant, frames)]) of one fresh example: the preferred continuation, the ``genuine`` rejected
    variants, and candidates ascended from the ``hacked`` rejected variants."""
    from nvrm import Clip
    from nvrm.prefs.synthetic import SynthSpec, make_example

    spec = SynthSpec()
    ex = make_example(seed, spec)
    context = Clip(ex["context"], spec.fps)
    out = [("preferred", "preferred", sampled(model, Clip(ex["preferred"], spec.fps)))]
    out += [("rejected", n, sampled(model, Clip(ex[n], spec.fps))) for n in genuine]
    starts = [sampled(model, Clip(ex[n], spec.fps)) for n in hacked]
    if starts:
        out += [("hacked", n, f) for n, f in zip(hacked, hack(model, context, starts, rng, steps))]
    return context, out


def build_guarded(work: Path, demo: Path, args) -> Path:
    """A copy of the demo bundle with a guard (fitted here on a separate synthetic split, unless it ships one)."""
    from nvrm import RewardModel
    from nvrm.guard import GuardFitSettings, write_bundle_guard
    from nvrm.train import fit_guard
    from nvrm.prefs.synthetic import DEGRADED, PHYSICS, write_task

    folder = work / "guarded"
    if (folder / "nvrm_guard.safetensors").is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(demo, folder)
    if (demo / "nvrm_guard.safetensors").is_file():
        say("guard: the demo bundle's own")
        return folder
    files = write_task(work / "guard-split", args.guard_examples, 0, seed=GUARD_SEED, variants=PHYSICS + DEGRADED)
    t0 = time.perf_counter()
    with RewardModel.from_pretrained(folder, device="cpu", dtype="float32") as model:
        guard = fit_guard(model, files["train"], settings=GuardFitSettings(attacks=args.guard_attacks, adaptive_rounds=0, holdout=0.0),
                          say=lambda line: say(f"guard fit: {line}"))
    write_bundle_guard(folder, guard)
    say(f"guard: fitted on {args.guard_examples} examples, {args.guard_attacks} attacks ({time.perf_counter() - t0:.0f} s)")
    return folder


def build_record(work: Path, guarded: Path, args) -> tuple[Path, dict[str, str], dict[str, Any]]:
    """The record (scored and written by an RL adapter with ``record=``), the truth of each candidate (frames key -> kind),
    and what it holds."""
    from nvrm import Clip, RewardModel, make_reward_fn
    from nvrm.record.capture import from_rl

    root = work / "record"
    truth_file = work / "record-truth.json"
    if truth_file.is_file():
        saved = json.loads(truth_file.read_text())
        return root, saved["truth"], saved["info"]
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(args.seed)
    truth: dict[str, str] = {}
    t0 = time.perf_counter()
    with RewardModel.from_pretrained(guarded, device="cpu", dtype="float32") as model:
        fn = make_reward_fn(model, record=str(root))
        for g in range(args.groups):
            names = rng.sample(REJECTED, args.genuine + args.hacked)
            context, cands = example_candidates(model, RECORD_SEED + g, names[:args.genuine], names[args.genuine:], args.hack_steps, rng)
            fps = model.contract.sample_fps
            fn([PROMPT] * len(cands), [context] * len(cands), [Clip(f, fps) for _, _, f in cands])
            truth.update({frames_key(f): kind for kind, _, f in cands})
            if (g + 1) % 8 == 0:
                say(f"record: {g + 1}/{args.groups} groups ({time.perf_counter() - t0:.0f} s)")
        from_rl(str(root)).writer.flush()
    info = {"groups": args.groups, "per_group": {"preferred": 1, "rejected": args.genuine, "hacked": args.hacked},
            "seconds": round(time.perf_counter() - t0, 1)}
    truth_file.write_text(json.dumps({"truth": truth, "info": info}))
    return root, truth, info


def build_gate(work: Path, demo: Path, args) -> Path:
    """The gate set: preferred against every rejected variant and against hacked candidates, as a pairs file of .npy files."""
    from nvrm import RewardModel
    folder = work / "gate"
    pairs = folder / "pairs.jsonl"
    if pairs.is_file():
        return pairs
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed + 1)
    rows = []
    with RewardModel.from_pretrained(demo, device="cpu", dtype="float32") as model:
        for e in range(args.gate_examples):
            hacked = rng.sample(REJECTED, args.gate_hacked)
            context, cands = example_candidates(model, GATE_SEED + e, list(REJECTED), hacked, args.hack_steps, rng)
            np.save(folder / f"e{e}_context.npy", sampled(model, context, "context"))
            for kind, name, frames in cands:
                np.save(folder / f"e{e}_{kind}_{name}.npy", frames)
            rows += [{"id": f"e{e}-{kind}-{name}", "kind": kind, "prompt": PROMPT, "context": f"e{e}_context.npy",
                      "chosen": f"e{e}_preferred_preferred.npy", "rejected": f"e{e}_{kind}_{name}.npy"} for kind, name, _ in cands[1:]]
            say(f"gate set: {e + 1}/{args.gate_examples} examples")
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return pairs


# -- selection ------------------------------------------------------------------------------------------------------

def read_record(root: Path, truth: dict[str, str]) -> list[dict[str, Any]]:
    """The record's groups as ``nvrm prefs pairs --from-record`` reads them, each candidate with its oracle kind."""
    try:
        from nvrm.prefs.pairing import record_rollouts
    except ImportError:  # before issue 55's move of it out of nvrm.record
        from nvrm.record.reader import record_rollouts  # type: ignore[attr-defined,no-redef]

    recorded, problems = record_rollouts(root)
    if problems:
        say(f"record: {len(problems)} problem(s), the first: {problems[0]}")
    groups = []
    for r in recorded:
        kinds = [truth[frames_key(np.load(p, allow_pickle=False))] for p in r.rollout.candidates]
        groups.append({"id": r.rollout.id, "prompt": r.rollout.prompt, "context": r.rollout.context, "paths": list(r.rollout.candidates),
                       "rewards": list(r.rewards), "uncertainties": list(r.uncertainties), "kinds": kinds})
    return groups


def every_pair(groups: list[dict]) -> list[tuple[int, int, int]]:
    return [(g, a, b) for g, grp in enumerate(groups) for a in range(len(grp["rewards"])) for b in range(a + 1, len(grp["rewards"]))]


def rank_active(groups: list[dict], guard: bool = True) -> list[tuple[int, int, int]]:
    """``--strategy active``'s order (``nvrm.prefs.active.plan_active``), with or without the recorded uncertainties."""
    from nvrm.prefs.active import Group, plan_active

    gs = [Group(g["id"], tuple(g["rewards"]), tuple(g["uncertainties"]) if guard else ()) for g in groups]
    plan = plan_active(gs, len(every_pair(groups)))
    return [(p.group, p.a, p.b) for p in plan.picks]


def rank_by(groups: list[dict], key: Callable[[dict, int, int], float]) -> list[tuple[int, int, int]]:
    """Every pair, the highest ``key`` first (ties: record order)."""
    return sorted(every_pair(groups), key=lambda t: -key(groups[t[0]], t[1], t[2]))


def _p(g: dict, a: int, b: int, guard: bool) -> tuple[float, float]:
    from nvrm.scoring.items import sigmoid

    r, u = g["rewards"], g["uncertainties"]
    p = sigmoid(r[a] - r[b])
    return p, sigmoid((r[a] - u[a]) - (r[b] - u[b])) if guard else p


def _disagree(g: dict, a: int, b: int) -> float:
    p, q = _p(g, a, b, True)
    return q * (1 - p) + (1 - q) * p


def _top_mass(g: dict) -> list[float]:
    """Each candidate's chance of being its group's best by the conservative reward (Plackett-Luce: softmax of c)."""
    c = [r - u for r, u in zip(g["rewards"], g["uncertainties"])]
    top = max(c)
    w = [float(np.exp(x - top)) for x in c]
    return [x / sum(w) for x in w]


ALTERNATIVES: dict[str, Callable[[list[dict]], list[tuple[int, int, int]]]] = {
    "active": lambda gs: rank_active(gs, True),
    "active without the guard (its fallback)": lambda gs: rank_active(gs, False),
    "margin (smallest reward gap over the record)": lambda gs: rank_by(gs, lambda g, a, b: -abs(g["rewards"][a] - g["rewards"][b])),
    "disagreement, no rank discount": lambda gs: rank_by(gs, _disagree),
    "uncertainty alone (u_a + u_b)": lambda gs: rank_by(gs, lambda g, a, b: g["uncertainties"][a] + g["uncertainties"][b]),
    "disagreement x top mass (softmax of c)": lambda gs: rank_by(gs, lambda g, a, b: _disagree(g, a, b) * sum(_top_mass(g)[i] for i in (a, b))),
}
"""Priorities compared by the corrections they find (no training); ``active`` is the library's."""


def random_order(groups: list[dict], draw: int) -> list[tuple[int, int, int]]:
    pairs = every_pair(groups)
    random.Random(1000 + draw).shuffle(pairs)
    return pairs


def oracle(kind_a: str, kind_b: str) -> str:
    """The synthetic truth: 'a', 'b' or 'tie' (two candidates that are not the preferred continuation)."""
    if kind_a == "preferred":
        return "a"
    return "b" if kind_b == "preferred" else "tie"


def corrections(groups: list[dict], order: list[tuple[int, int, int]], budget: int) -> dict[str, int]:
    """Of the first ``budget`` pairs: how many verdicts go against the model's ranking (it ranks the oracle's loser first),
    and how many are ties."""
    fixed = ties = 0
    for g, a, b in order[:budget]:
        grp = groups[g]
        verdict = oracle(grp["kinds"][a], grp["kinds"][b])
        ties += verdict == "tie"
        win, lose = (a, b) if verdict == "a" else (b, a)
        fixed += verdict != "tie" and grp["rewards"][lose] >= grp["rewards"][win]
    return {"corrections": fixed, "ties": ties}


def labelled(groups: list[dict], picks: list[tuple[int, int, int]], ties: str = "drop") -> list[dict]:
    """The oracle's verdicts as the pairs nvrm prefs filter writes: a verdict for the preferred continuation is a pair; a
    tie (two broken candidates) is dropped (``ties="drop"``: the judge call is spent, as when a judge's two orders disagree
    and the filter removes the pair) or kept as a tie pair (``"train"``)."""
    rows = []
    for g, a, b in picks:
        grp = groups[g]
        verdict = oracle(grp["kinds"][a], grp["kinds"][b])
        if verdict == "tie" and ties == "drop":
            continue
        chosen, rejected = (a, b) if verdict in ("a", "tie") else (b, a)
        row = {"prompt": grp["prompt"], "context": grp["context"], "chosen": grp["paths"][chosen], "rejected": grp["paths"][rejected]}
        if verdict == "tie":
            row["tie"] = True
        rows.append(row)
    return rows


# -- training and the gate ------------------------------------------------------------------------------------------

def gate_accuracy(bundle: Path | str, gate_pairs: Path) -> dict[str, Any]:
    """Accuracy on the gate set, over all pairs and per kind (``summarize``, the gate's figure). Each example's candidates are
    scored as one group (``score_groups``: one context prefill for its 19 pairs); the gate's ``evaluate_pairs`` scores each
    pair as a group of two on the same path."""
    from nvrm import RewardModel
    from nvrm.report.evaluate import PairOutcome, summarize

    rows = [json.loads(line) for line in gate_pairs.read_text().splitlines()]
    by_context: dict[str, list[dict]] = {}
    for r in rows:
        by_context.setdefault(r["context"], []).append(r)
    base = gate_pairs.parent
    outcomes: list[tuple[str, PairOutcome]] = []
    with RewardModel.from_pretrained(bundle, device="cpu", dtype="float32") as model:
        groups = [(PROMPT, str(base / ctx), [str(base / members[0]["chosen"])] + [str(base / m["rejected"]) for m in members])
                  for ctx, members in by_context.items()]
        for members, results in zip(by_context.values(), model.score_groups(groups)):
            outcomes += [(m["kind"], PairOutcome(results[0].reward, r.reward)) for m, r in zip(members, results[1:])]
    out = {"accuracy": summarize([o for _, o in outcomes])["accuracy"], "n": len(outcomes)}
    for kind in sorted({k for k, _ in outcomes}):
        out[kind] = summarize([o for k, o in outcomes if k == kind])["accuracy"]
    return out


def build_replay(work: Path, args) -> list[dict]:
    """Original pairs replayed in every refresh (the same for every strategy and budget): the synthetic task's seed-0
    training examples, the demo model's own data, so a refresh on a few judged pairs does not forget the rest."""
    from nvrm.prefs.synthetic import DEGRADED, PHYSICS, write_task

    if args.replay_examples == 0:
        return []
    folder = work / f"replay-{args.replay_examples}"
    if not (folder / "train_pairs.jsonl").is_file():
        write_task(folder, args.replay_examples, 0, seed=0, variants=PHYSICS + DEGRADED)
    rows = [json.loads(line) for line in (folder / "train_pairs.jsonl").read_text().splitlines()]
    return [{**r, **{k: str(folder / r[k]) for k in ("context", "chosen", "rejected")}} for r in rows]


def refresh(demo: Path, rows: list[dict], run: Path, gate_pairs: Path, args, seed: int, replay: list[dict] = ()) -> dict[str, Any]:
    """A LoRA from the demo bundle on the labelled pairs and the ``replay`` pairs (``nvrm.train.fit``), and its gate accuracy."""
    import contextlib
    import io

    from nvrm.train.config import TrainConfig
    from nvrm.train.fit import fit

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, *replay]))
    config = TrainConfig(epochs=args.epochs, lora_rank=args.lora_rank, lr=args.lr, warmup_steps=0, batch_pairs=8, cache_inputs=True,
                         seed=seed, save_every=100_000, keep_checkpoints=1)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        summary = fit(demo, run / "pairs.jsonl", run / "out", config)
    result = gate_accuracy(summary.bundle, gate_pairs)
    result.update(steps=summary.steps, seconds=round(time.perf_counter() - t0, 1))
    shutil.rmtree(run, ignore_errors=True)
    return result


# -- the run --------------------------------------------------------------------------------------------------------

def calls_to_reach(curve: dict[int, float], target: float) -> int | None:
    """The fewest judged pairs at which ``curve`` (budget -> mean accuracy) reaches ``target`` (None: never)."""
    hits = [b for b, acc in sorted(curve.items()) if acc >= target - 1e-9]
    return hits[0] if hits else None


def claim(curves: dict[str, dict[int, float]]) -> dict[str, Any]:
    """For each budget of random selection: the fewest pairs active selection needs for the same accuracy, and the ratio;
    the headline is the ratio at random's best accuracy."""
    rand, act = curves["random"], curves["active"]
    per_budget = {}
    for b, acc in sorted(rand.items()):
        need = calls_to_reach(act, acc)
        per_budget[str(b)] = {"random_accuracy": acc, "active_pairs": need, "ratio": None if need is None else need / b}
    best_budget = min((b for b in rand if rand[b] == max(rand.values())))
    head = per_budget[str(best_budget)]
    return {"random_best": {"pairs": best_budget, "accuracy": rand[best_budget]}, "active_pairs_for_it": head["active_pairs"],
            "ratio": head["ratio"], "holds": head["ratio"] is not None and head["ratio"] <= 0.5, "per_random_budget": per_budget}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    base = result["demo_model"]["accuracy"]
    for name, style in (("random", "o--"), ("active", "s-"), ("margin", "^:")):
        runs = result["curves"].get(name)
        if not runs:
            continue
        budgets = [0] + [int(b) for b in runs["mean"]]
        means = [base] + list(runs["mean"].values())
        lows = [base] + [min(v) for v in runs["runs"].values()]
        highs = [base] + [max(v) for v in runs["runs"].values()]
        label = {"random": "random pairs", "active": "--strategy active (guard + BT closeness)",
                 "margin": "smallest reward gap over the record"}[name]
        line, = ax.plot(budgets, means, style, label=f"{label} (mean of {len(next(iter(runs['runs'].values())))})")
        ax.fill_between(budgets, lows, highs, color=line.get_color(), alpha=0.12)
    c = result["claim"]
    ax.axhline(c["random_best"]["accuracy"], color="gray", lw=0.8)
    ax.set_xscale("symlog", linthresh=8)
    ticks = [0] + [int(b) for b in result["budgets"]]
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlabel("judged pairs (each asked in both orders)")
    ax.set_ylabel("gate accuracy (held-out pairs, hacked included)")
    best = c["random_best"]
    ratio = ("active selection does not reach it" if c["ratio"] is None
             else f"active selection reaches it with {c['active_pairs_for_it']} ({c['ratio']:.2f}x)")
    ax.set_title(f"Random selection's best: {best['accuracy']:.3f} at {best['pairs']} judged pairs;\n{ratio}", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results/active-judging.json")
    p.add_argument("--plot", help="PNG of both curves (docs/img/active-judging.png)")
    p.add_argument("--replot", metavar="JSON", help="only draw --plot from a results file this benchmark wrote")
    p.add_argument("--work", help="folder for the guard, the record, the gate set and the runs (kept; reused when it has them)")
    p.add_argument("--groups", type=int, default=24, help="record groups (fresh examples)")
    p.add_argument("--genuine", type=int, default=3, help="genuine rejected candidates per group")
    p.add_argument("--hacked", type=int, default=2, help="hacked candidates per group")
    p.add_argument("--hack-steps", type=int, default=8)
    p.add_argument("--gate-examples", type=int, default=8)
    p.add_argument("--gate-hacked", type=int, default=4, help="hacked candidates per gate example (besides its 14 rejected variants)")
    p.add_argument("--guard-examples", type=int, default=4, help="examples of the guard's own synthetic split (14 pairs each)")
    p.add_argument("--guard-attacks", type=int, default=24)
    p.add_argument("--budgets", default="8,16,32,64,128,256", help="judged pairs")
    p.add_argument("--draws", type=int, default=3, help="random draws (and training seeds of each non-random curve)")
    p.add_argument("--curves", default="random,active", help="trained curves: random, active, margin")
    p.add_argument("--ties", choices=("drop", "train"), default="drop",
                   help="what the oracle's ties (two candidates that are not the preferred one) become: dropped, or tie pairs")
    p.add_argument("--replay-examples", type=int, default=2,
                   help="synthetic seed-0 training examples (14 pairs each) replayed in every refresh; 0: judged pairs only")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads (the run is niced)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.replot:
        plot(json.loads(Path(args.replot).read_text()), Path(args.plot or "docs/img/active-judging.png"))
        return 0
    os.nice(10)
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from nvrm.cli.demo import demo_bundle_path

    t_start = time.perf_counter()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="nvrm-active-judging-"))
    work.mkdir(parents=True, exist_ok=True)
    demo = demo_bundle_path()
    budgets = sorted(int(b) for b in args.budgets.split(","))
    timings_file = work / "setup-seconds.json"
    timings = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
    built: dict[str, Any] = {}
    for name, done, build in (("guard", work / "guarded" / "nvrm_guard.safetensors", lambda: build_guarded(work, demo, args)),
                              ("record", work / "record-truth.json", lambda: build_record(work, built["guard"], args)),
                              ("gate", work / "gate" / "pairs.jsonl", lambda: build_gate(work, demo, args))):
        fresh, t0 = not done.is_file(), time.perf_counter()
        built[name] = build()
        if fresh:
            timings[name] = round(time.perf_counter() - t0, 1)
    timings_file.write_text(json.dumps(timings))
    root, truth, record_info = built["record"]
    gate_pairs = built["gate"]
    setup_s = time.perf_counter() - t_start
    groups = read_record(root, truth)
    replay = build_replay(work, args)
    say(f"setup {setup_s:.0f} s: {len(groups)} groups, {len(every_pair(groups))} pairs in the record")
    hacked_u = [u for g in groups for u, k in zip(g["uncertainties"], g["kinds"]) if k == "hacked"]
    genuine_u = [u for g in groups for u, k in zip(g["uncertainties"], g["kinds"]) if k != "hacked"]
    from nvrm.guard.separation import auroc

    record_info.update(auroc_hacked_vs_genuine=round(auroc(hacked_u, genuine_u), 4),
                       mean_uncertainty={"hacked": statistics.fmean(hacked_u), "genuine": statistics.fmean(genuine_u)},
                       hacked_over_preferred=sum(g["rewards"][i] > g["rewards"][g["kinds"].index("preferred")]
                                                 for g in groups for i, k in enumerate(g["kinds"]) if k == "hacked"))
    say(f"record: {json.dumps(record_info)}")
    base = gate_accuracy(demo, gate_pairs)
    say(f"demo model on the gate set: {base}")
    orders = {name: f(groups) for name, f in ALTERNATIVES.items()}
    orders.update({f"random (draw {d})": random_order(groups, d) for d in range(args.draws)})
    found = {name: {str(b): corrections(groups, order, b) for b in budgets} for name, order in orders.items()}
    for name, row in found.items():
        say(f"corrections {name}: " + ", ".join(f"{b}: {v['corrections']} ({v['ties']} ties)" for b, v in row.items()))
    curves: dict[str, Any] = {}
    names = {"random": None, "active": "active", "margin": "margin (smallest reward gap over the record)"}
    for curve in [c.strip() for c in args.curves.split(",") if c.strip()]:
        runs: dict[str, list[float]] = {str(b): [] for b in budgets}
        detail: dict[str, list[dict]] = {str(b): [] for b in budgets}
        for d in range(args.draws):
            order = random_order(groups, d) if curve == "random" else orders[names[curve]]
            for b in budgets:
                labels = labelled(groups, order[:b], args.ties)
                r = refresh(demo, labels, work / "run", gate_pairs, args, seed=d, replay=replay)
                r["labelled_pairs"] = len(labels)
                runs[str(b)].append(r["accuracy"])
                detail[str(b)].append(r)
                say(f"{curve} draw {d} budget {b}: gate accuracy {r['accuracy']:.4f} (hacked {r.get('hacked')}, rejected {r.get('rejected')}; "
                    f"{r['steps']} steps, {r['seconds']} s)")
        curves[curve] = {"mean": {b: statistics.fmean(v) for b, v in runs.items()}, "runs": runs, "detail": detail}
    result = {
        "benchmark": "active_judging", "command": " ".join([sys.executable.split('/')[-1], *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(), "torch_threads": args.threads},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "plot", "work")},
        "budgets": budgets, "record": record_info, "demo_model": base, "corrections": found, "curves": curves,
        "seconds": {"setup_this_run": round(setup_s, 1), "setup_when_built": timings, "total_this_run": round(time.perf_counter() - t_start, 1)},
    }
    if "random" in curves and "active" in curves:
        result["claim"] = claim({k: {int(b): acc for b, acc in v["mean"].items()} for k, v in curves.items()})
        say(f"claim: {json.dumps(result['claim'])}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot and "claim" in result:
        plot(result, Path(args.plot))
    say(f"wrote {args.out} ({result['seconds']['total_this_run']:.0f} s)")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
