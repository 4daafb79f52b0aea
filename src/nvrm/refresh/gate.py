"""The refresh gate: a candidate model is exported only when, on data it never trained on, it holds up.

Checks (each with its figures, current and candidate side by side):

- ``holdout``: agreement with the judges on the cycle's held-out judged pairs (pairwise accuracy) is at
  least the current model's; both are reported with a 95% Wilson interval;
- ``anchor`` (with ``--anchor-pairs``): accuracy on the user's original preference pairs drops by no more
  than ``--max-anchor-drop``;
- ``rewards``: every candidate reward is finite and the rewards are not collapsed to one value (the
  training collapse check, ``nvrm.train.fit``).

``nvrm probe`` on the record's contexts is not part of the gate yet (docs/refresh.md).
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
    return (max(0.0, centre - half), min(1.0, centre + half))


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
    from ..train.fit import _refuse_collapsed

    bad = [r for r in rewards if not math.isfinite(r)]
    if bad:
        return {"passed": False, "why": f"{len(bad)} of {len(rewards)} candidate rewards are not finite (e.g. {bad[0]})"}
    try:
        _refuse_collapsed(summary, "held-out")
    except TrainingError as e:
        return {"passed": False, "why": str(e)}
    return {"passed": True, "why": f"{len(rewards)} finite rewards, std {((summary.get('rewards') or {}).get('all') or {}).get('std')}"}


def _score(model, path: str | Path) -> tuple[dict[str, Any], list[float], int]:
    from ..prefs.pairs import read_pairs
    from ..report.evaluate import evaluate_pairs, summarize

    outcomes, problems = evaluate_pairs(model, read_pairs(path))
    return summarize(outcomes, len(problems)), [r for o in outcomes for r in (o.chosen, o.rejected)], len(problems)


def run_gate(current: str | Path, candidate: str | Path, holdout: str | Path, *, anchor_pairs: str | Path | None = None,
             max_anchor_drop: float = 0.02, device: str | None = None, dtype: str | None = None) -> dict[str, Any]:
    """The gate's report: both models on the held-out pairs (and the anchors), each check and ``passed``.

    Both models are scored in the training dtype (``dtype``; None: training's default, float32 unless on CUDA), so the gate
    sees the differences training saw."""
    import torch

    from ..scoring.reward_model import RewardModel

    cuda = str(device).startswith("cuda") if device else torch.cuda.is_available()
    dtype = dtype or ("bfloat16" if cuda else "float32")

    files = {"holdout": holdout, **({"anchor": anchor_pairs} if anchor_pairs else {})}
    figures: dict[str, dict[str, Any]] = {}
    cand_rewards: list[float] = []
    cand_holdout: dict[str, Any] = {}
    for role, bundle in (("current", current), ("candidate", candidate)):
        with RewardModel.from_pretrained(bundle, device=device, dtype=dtype) as model:
            for name, path in files.items():
                summary, rewards, failed = _score(model, path)
                figures.setdefault(name, {})[role] = _side(summary, failed)
                if role == "candidate" and name == "holdout":
                    cand_rewards, cand_holdout = rewards, summary
    checks = {"holdout": compare(figures["holdout"]["current"], figures["holdout"]["candidate"], max_drop=None)}
    if anchor_pairs:
        checks["anchor"] = compare(figures["anchor"]["current"], figures["anchor"]["candidate"], max_drop=max_anchor_drop)
    checks["rewards"] = reward_check(cand_rewards, cand_holdout)
    return {"passed": all(c["passed"] for c in checks.values()), "checks": checks, "current": str(current),
            "candidate": str(candidate), "files": {k: str(v) for k, v in files.items()}, "dtype": dtype,
            "not_checked": ["probe: nvrm probe on the record's contexts is not part of the gate yet"]}


def failure_line(report: dict[str, Any]) -> str:
    """The one line a failed gate prints: the checks that failed and why."""
    return "; ".join(f"{name}: {c['why']}" for name, c in report["checks"].items() if not c["passed"])


def _fmt(side: dict[str, Any] | None) -> str:
    if not side or side.get("accuracy") is None:
        return "n/a"
    lo, hi = side["interval95"]
    return f"{side['accuracy']:.4f} [{lo:.3f}, {hi:.3f}] over {side['n']}"


def write_report(report: dict[str, Any], folder: str | Path) -> tuple[Path, Path]:
    """``gate.json`` and ``gate.html`` (the figures side by side) in ``folder``, written whether the gate passed or not."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    js = folder / "gate.json"
    js.write_text(json.dumps(report, indent=1, default=str) + "\n")
    rows = []
    for name, c in report["checks"].items():
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
            + "".join(rows) + "</table>"
            + "".join(f"<p>not checked: {html.escape(x)}</p>" for x in report.get("not_checked", [])))
    page_path = folder / "gate.html"
    page_path.write_text(page)
    return js, page_path
