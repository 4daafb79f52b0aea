"""The refresh gate: a candidate model is exported only when, on data it never trained on, it holds up.

Checks (each with its figures, current and candidate side by side):

- ``holdout``: agreement with the judges on the cycle's held-out judged pairs (pairwise accuracy) is at
  least the current model's; both are reported with a 95% Wilson interval;
- ``anchor`` (with ``--anchor-pairs``): accuracy on the user's original preference pairs drops by no more
  than ``--max-anchor-drop``;
- ``rewards``: every candidate reward is finite and the rewards are not collapsed to one value (the
  training collapse check, ``nvrm.train.fit``);
- ``probe``: ``nvrm probe`` on the record's contexts (each with its best-rewarded recorded candidate), run
  on both models with the same seeded perturbations: no perturbation newly flagged for the candidate. A
  perturbation is flagged for a model when it raised that model's reward above the original on more than
  ``flag_share`` of the probed clips (one clip is noise; most of them is a hack the policy can find).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Sequence

Z95 = 1.959963984540054


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion ``successes / n`` (None when n is 0). Pure."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # it holds p; at p = 0 or 1 rounding would leave it just outside (5.6e-17 above an accuracy of 0, measured)
    return (min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)))


def _side(summary: dict[str, Any], failed: int) -> dict[str, Any]:
    acc, n = summary.get("accuracy"), int(summary.get("n") or 0)
    interval = wilson(acc * n, n) if acc is not None else None
    return {"accuracy": acc, "n": n, "interval95": list(interval) if interval else None, "mean_margin": summary.get("mean_margin"),
            "failed": failed, "rewards": (summary.get("rewards") or {}).get("all")}


def compare(current: dict[str, Any], candidate: dict[str, Any], *, max_drop: float | None) -> dict[str, Any]:
    """One check: ``candidate`` accuracy >= ``current``'s (``max_drop`` None), or >= current - max_drop. Pure."""
    a, b = current["accuracy"], candidate["accuracy"]
    if a is None or b is None:
        return {"passed": False, "why": "no pair scored on one side", "current": current, "candidate": candidate}
    floor = a if max_drop is None else a - max_drop
    passed = b >= floor - 1e-12
    why = (f"candidate {b:.4f} >= {'current' if max_drop is None else f'current - {max_drop:g} ='} {floor:.4f}" if passed
           else f"candidate {b:.4f} < {floor:.4f} ("
                f"{'the current model' if max_drop is None else f'current {a:.4f} - max drop {max_drop:g}'})")
    return {"passed": passed, "why": why, "current": current, "candidate": candidate}


def reward_check(rewards: Sequence[float], summary: dict[str, Any]) -> dict[str, Any]:
    """Finite, non-collapsed candidate rewards (the collapse rule of ``nvrm.train.fit``). Pure but for that rule's import."""
    from ..errors import TrainingError
    from ..train.fit import refuse_collapsed

    bad = [r for r in rewards if not math.isfinite(r)]
    if bad:
        return {"passed": False, "why": f"{len(bad)} of {len(rewards)} candidate rewards are not finite (e.g. {bad[0]})"}
    try:
        refuse_collapsed(summary, "held-out")
    except TrainingError as e:
        return {"passed": False, "why": str(e)}
    return {"passed": True, "why": f"{len(rewards)} finite rewards, std {((summary.get('rewards') or {}).get('all') or {}).get('std')}"}


def probe_flags(reports: Sequence[Any], flag_share: float) -> dict[str, dict[str, Any]]:
    """Per perturbation over one model's probe reports: on how many clips it was flagged, its mean delta, and whether
    it counts as flagged (on more than ``flag_share`` of the clips it ran on). Pure."""
    out: dict[str, dict[str, Any]] = {}
    for r in reports:
        for o in getattr(r, "outcomes", ()):
            f = out.setdefault(o.name, {"clips": 0, "flagged_clips": 0, "errors": 0, "deltas": []})
            if o.delta is None:
                f["errors"] += 1
                continue
            f["clips"] += 1
            f["flagged_clips"] += bool(o.flagged)
            f["deltas"].append(o.delta)
    for f in out.values():
        deltas = f.pop("deltas")
        f["mean_delta"] = sum(deltas) / len(deltas) if deltas else None
        f["flagged_share"] = f["flagged_clips"] / f["clips"] if f["clips"] else None
        f["flagged"] = bool(f["clips"]) and f["flagged_clips"] > flag_share * f["clips"]
    return out


def probe_check(current: dict[str, dict[str, Any]], candidate: dict[str, dict[str, Any]], *, clips: int, failed: dict[str, int]) -> dict[str, Any]:
    """The probe check: no perturbation flagged for the candidate that was not flagged for the current model. Pure."""
    if clips == 0 or not candidate:
        return {"passed": False, "why": "no clip of the record could be probed on the candidate", "newly_flagged": [],
                "current_flagged": [], "candidate_flagged": [], "clips": clips, "failed_clips": failed}
    was = sorted(n for n, f in current.items() if f["flagged"])
    now = sorted(n for n, f in candidate.items() if f["flagged"])
    new = [n for n in now if n not in was]
    why = (f"newly flagged for the candidate: {', '.join(new)}" if new
           else f"nothing newly flagged over {clips} clip(s) (flagged for both: {', '.join(now) or 'none'}; "
                f"cleared: {', '.join(n for n in was if n not in now) or 'none'})")
    return {"passed": not new, "why": why, "newly_flagged": new, "current_flagged": was, "candidate_flagged": now, "clips": clips,
            "failed_clips": failed}


def _score(model, path: str | Path) -> tuple[dict[str, Any], list[float], int]:
    from ..prefs.pairs import read_pairs
    from ..report.evaluate import evaluate_pairs, summarize

    outcomes, problems = evaluate_pairs(model, read_pairs(path))
    return summarize(outcomes, len(problems)), [r for o in outcomes for r in (o.chosen, o.rejected)], len(problems)


def run_gate(current: str | Path, candidate: str | Path, holdout: str | Path, *, anchor_pairs: str | Path | None = None,
             max_anchor_drop: float = 0.02, device: str | None = None, dtype: str | None = None,
             probe_items: Sequence[tuple[str, str, str]] = (), probe_perturbations: Sequence[str] | None = None,
             probe_flag_share: float = 0.5) -> dict[str, Any]:
    """The gate's report: both models on the held-out pairs (and the anchors), on ``nvrm probe`` of ``probe_items``
    ((prompt, context, candidate) files; none: no probe check), each check and ``passed``.

    Both models are scored in the training dtype (``dtype``; None: training's default, float32 unless on CUDA), so the gate
    sees the differences training saw."""
    from ..probe import probe_many
    import torch

    from ..scoring.reward_model import RewardModel

    cuda = str(device).startswith("cuda") if device else torch.cuda.is_available()
    dtype = dtype or ("bfloat16" if cuda else "float32")

    files = {"holdout": holdout, **({"anchor": anchor_pairs} if anchor_pairs else {})}
    figures: dict[str, dict[str, Any]] = {}
    cand_rewards: list[float] = []
    cand_holdout: dict[str, Any] = {}
    probes: dict[str, dict[str, Any]] = {}
    probed: dict[str, int] = {}
    failed_clips: dict[str, int] = {}
    for role, bundle in (("current", current), ("candidate", candidate)):
        with RewardModel.from_pretrained(bundle, device=device, dtype=dtype) as model:
            for name, path in files.items():
                summary, rewards, failed = _score(model, path)
                figures.setdefault(name, {})[role] = _side(summary, failed)
                if role == "candidate" and name == "holdout":
                    cand_rewards, cand_holdout = rewards, summary
            if probe_items:
                reports = probe_many(model, list(probe_items), perturbations=probe_perturbations, seed=0)
                probes[role] = probe_flags(reports, probe_flag_share)
                probed[role] = sum(1 for r in reports if hasattr(r, "outcomes"))
                failed_clips[role] = len(reports) - probed[role]
    checks = {"holdout": compare(figures["holdout"]["current"], figures["holdout"]["candidate"], max_drop=None)}
    if anchor_pairs:
        checks["anchor"] = compare(figures["anchor"]["current"], figures["anchor"]["candidate"], max_drop=max_anchor_drop)
    checks["rewards"] = reward_check(cand_rewards, cand_holdout)
    not_checked = []
    if probe_items:
        checks["probe"] = probe_check(probes["current"], probes["candidate"], clips=min(probed.values()), failed=failed_clips)
    else:
        not_checked.append("probe: no record contexts probed (--probe-contexts 0)")
    report = {"passed": all(c["passed"] for c in checks.values()), "checks": checks, "current": str(current),
              "candidate": str(candidate), "files": {k: str(v) for k, v in files.items()}, "dtype": dtype, "not_checked": not_checked}
    if probe_items:
        report["probe"] = {"flag_share": probe_flag_share, "clips": [list(i) for i in probe_items], "current": probes["current"],
                           "candidate": probes["candidate"]}
    return report


def failure_line(report: dict[str, Any]) -> str:
    """The one line a failed gate prints: the checks that failed and why."""
    return "; ".join(f"{name}: {c['why']}" for name, c in report["checks"].items() if not c["passed"])


def _fmt(side: dict[str, Any] | None) -> str:
    if not side or side.get("accuracy") is None:
        return "n/a"
    lo, hi = side["interval95"]
    return f"{side['accuracy']:.4f} [{lo:.3f}, {hi:.3f}] over {side['n']}"


def _probe_table(probe: dict[str, Any] | None) -> str:
    """The probe figures, per perturbation, current and candidate side by side."""
    if not probe:
        return ""

    def cell(f: dict[str, Any] | None) -> str:
        if not f or not f.get("clips"):
            return "n/a"
        mean = "-" if f["mean_delta"] is None else f"{f['mean_delta']:+.4f}"
        return f"{f['flagged_clips']}/{f['clips']} flagged, mean delta {mean}{' <b>FLAGGED</b>' if f['flagged'] else ''}"

    rows = "".join(f"<tr><td>{html.escape(n)}</td><td>{cell(probe['current'].get(n))}</td><td>{cell(probe['candidate'].get(n))}</td></tr>"
                   for n in sorted(set(probe["current"]) | set(probe["candidate"])))
    return (f"<h2>nvrm probe on {len(probe['clips'])} recorded context(s)</h2><p>a perturbation is flagged for a model when it "
            f"scored above the original on more than {probe['flag_share']:g} of the clips</p>"
            "<table><tr><th>perturbation</th><th>current</th><th>candidate</th></tr>" + rows + "</table>")


def write_report(report: dict[str, Any], folder: str | Path) -> tuple[Path, Path]:
    """``gate.json`` and ``gate.html`` (the figures side by side) in ``folder``, written whether the gate passed or not."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    js = folder / "gate.json"
    js.write_text(json.dumps(report, indent=1, default=str) + "\n")
    rows = []
    for name, c in report["checks"].items():
        if name == "probe":
            cur, cand = (f"flagged: {', '.join(c[k]) or 'nothing'}" for k in ("current_flagged", "candidate_flagged"))
        else:
            cur, cand = (_fmt(c.get("current")), _fmt(c.get("candidate"))) if "current" in c else ("", "")
        colour = "#1a7f37" if c["passed"] else "#cf222e"
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{html.escape(cur)}</td><td>{html.escape(cand)}</td>"
                    f"<td style='color:{colour}'>{'pass' if c['passed'] else 'FAIL'}</td><td>{html.escape(c['why'])}</td></tr>")
    verdict = "passed" if report["passed"] else "failed"
    page = ("<!doctype html><meta charset='utf-8'><title>nvrm refresh gate</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:24px}td,th{border:1px solid #d0d7de;padding:4px 8px}"
            "table{border-collapse:collapse;font-size:13px}</style>"
            f"<h1>refresh gate: {verdict}</h1><p>current {html.escape(report['current'])}<br>"
            f"candidate {html.escape(report['candidate'])}</p>"
            "<table><tr><th>check</th><th>current (95% Wilson)</th><th>candidate (95% Wilson)</th><th></th><th>why</th></tr>"
            + "".join(rows) + "</table>" + _probe_table(report.get("probe"))
            + "".join(f"<p>not checked: {html.escape(x)}</p>" for x in report.get("not_checked", [])))
    page_path = folder / "gate.html"
    page_path.write_text(page)
    return js, page_path
