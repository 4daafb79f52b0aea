"""A judge's answer as a verdict, and what a set of verdicts agrees on (pure).

``parse_verdict`` accepts exactly two forms: a JSON object with ``"winner"`` one of ``first``,
``second``, ``tie`` (alone, or in a fenced ```json block), or one of those words alone. Anything
else is *unparsed*: the raw text is kept and no winner is guessed. ``confidence_from_logprobs``
reads the probability of the answer's token where the server returned log-probabilities.

``agreement`` reports, per judge, how often its two presentation orders of a pair agree (order
consistency), and, between judges, how often their order-consistent outcomes agree.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable

WINNERS = ("first", "second", "tie")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_OBJECT = re.compile(r"\{[^{}]*\}", re.S)


@dataclass(frozen=True)
class Verdict:
    winner: str | None
    """first | second | tie, or None when the answer could not be parsed."""
    reason: str | None = None
    """Why it is unparsed (None when parsed)."""
    confidence: float | None = None


def parse_verdict(text: str) -> Verdict:
    """The verdict of an answer; never a guessed winner."""
    body = (text or "").strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if body.lower().strip(". ") in WINNERS:
        return Verdict(body.lower().strip(". "))
    objects = []
    try:
        whole = json.loads(body)
        objects = [whole] if isinstance(whole, dict) else []
    except ValueError:
        for m in _OBJECT.finditer(body):  # an object within prose counts only when it is the one object there
            try:
                obj = json.loads(m.group(0))
            except ValueError:
                continue
            if isinstance(obj, dict):
                objects.append(obj)
    if not objects:
        return Verdict(None, "no JSON object with a winner and not one of first, second, tie")
    if len({json.dumps(o, sort_keys=True) for o in objects}) > 1:
        return Verdict(None, "several different JSON objects")
    winner = objects[0].get("winner")
    if not isinstance(winner, str) or winner.strip().lower() not in WINNERS:
        return Verdict(None, f"'winner' is {winner!r}, not one of first, second, tie")
    return Verdict(winner.strip().lower())


def confidence_from_logprobs(logprobs: Any, winner: str | None) -> float | None:
    """P of the winner's token, renormalised over the three answers where the server listed alternatives."""
    if not winner or not isinstance(logprobs, dict):
        return None
    for tok in logprobs.get("content") or []:
        text = str(tok.get("token", "")).strip().strip('"').lower()
        if not text or not winner.startswith(text):
            continue
        alts = {str(a.get("token", "")).strip().strip('"').lower(): a.get("logprob") for a in tok.get("top_logprobs") or []}
        mass = {w: math.exp(alts[k]) for w in WINNERS for k in alts if k and w.startswith(k) and isinstance(alts[k], (int, float))}
        p = math.exp(tok["logprob"]) if isinstance(tok.get("logprob"), (int, float)) else None
        if p is None:
            return None
        total = sum(mass.values()) if mass else 1.0  # no alternatives listed: the token's own probability
        return min(1.0, p / max(total, p))
    return None


def _outcome(row: dict) -> str | None:
    """The video that won (or tie), whatever order it was shown in."""
    w = row.get("winner")
    if w not in WINNERS:
        return None
    return "tie" if w == "tie" else (row["first"] if w == "first" else row["second"])


def consistent_outcomes(rows: Iterable[dict]) -> dict[str, dict[str, str | None]]:
    """judge -> pair -> its outcome when both orders were judged and agree (None: judged both ways, disagreeing)."""
    seen: dict[tuple[str, str], dict[str, list[str | None]]] = {}
    for r in rows:
        out = _outcome(r)
        if out is None:
            continue
        seen.setdefault((str(r.get("judge", "")), str(r["pair_id"])), {}).setdefault(r.get("order", ""), []).append(out)
    result: dict[str, dict[str, str | None]] = {}
    for (judge, pair), by_order in seen.items():
        if len(by_order) < 2:
            continue
        outcomes = {o for v in by_order.values() for o in v}
        result.setdefault(judge, {})[pair] = outcomes.pop() if len(outcomes) == 1 else None
    return result


def agreement(rows: list[dict]) -> dict[str, Any]:
    """Per judge: pairs judged in both orders and the fraction of them that agree; between each two judges:
    pairs both judged consistently and the fraction with the same outcome."""
    by_judge = consistent_outcomes(rows)
    for r in rows:  # every judge is reported, also one with no pair judged in both orders
        by_judge.setdefault(str(r.get("judge", "")), {})
    per = {j: {"pairs_both_orders": len(v), "order_consistency": (sum(o is not None for o in v.values()) / len(v)) if v else None}
           for j, v in sorted(by_judge.items())}
    cross = {}
    for a, b in itertools.combinations(sorted(by_judge), 2):
        shared = [p for p in by_judge[a] if p in by_judge[b] and by_judge[a][p] is not None and by_judge[b][p] is not None]
        same = sum(by_judge[a][p] == by_judge[b][p] for p in shared)
        cross[f"{a}|{b}"] = {"pairs": len(shared), "agreement": same / len(shared) if shared else None}
    return {"per_judge": per, "cross_judge": cross}


def judged_pairs(rows: list[dict]) -> dict[str, list[Any]]:
    """Each judge's order-consistent verdicts as preference pairs (``Pair``; ties flagged), for scoring a model against them."""
    from .pairs import Pair

    where = {str(r["pair_id"]): r for r in rows if r.get("winner") in WINNERS}
    out: dict[str, list[Any]] = {}
    for judge, outcomes in consistent_outcomes(rows).items():
        for n, (pair, outcome) in enumerate(sorted(outcomes.items())):
            if outcome is None:
                continue
            r = where[pair]
            a, b = r["first"], r["second"]
            chosen, rejected = (a, b) if outcome in ("tie", a) else (b, a)
            out.setdefault(judge, []).append(Pair(n + 1, pair, r["prompt"], r["context"], chosen, rejected, tie=outcome == "tie"))
    return out
