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


class _Ambiguous(ValueError):
    """A JSON object that gives one key twice: which one counts is the parser's choice, so none does."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Ambiguous(f"the key {key!r} appears twice in one JSON object")
        obj[key] = value
    return obj


def _strict_json(text: str) -> Any:
    """``json.loads`` refusing duplicate keys (``_Ambiguous``); input nested too deeply is a ValueError too."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def parse_verdict(text: Any) -> Verdict:
    """The verdict of an answer; never a guessed winner, and none from ambiguous JSON."""
    if text is not None and not isinstance(text, str):
        return Verdict(None, f"the answer is {type(text).__name__}, not text")
    body = (text or "").strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if body.lower().strip(". ") in WINNERS:
        return Verdict(body.lower().strip(". "))
    objects = []
    try:
        whole = _strict_json(body)
        objects = [whole] if isinstance(whole, dict) else []
    except _Ambiguous as e:
        return Verdict(None, f"ambiguous JSON: {e}")
    except ValueError:
        for m in _OBJECT.finditer(body):  # an object within prose counts only when it is the one object there
            try:
                obj = _strict_json(m.group(0))
            except _Ambiguous as e:
                return Verdict(None, f"ambiguous JSON: {e}")
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
        return Verdict(None, f"'winner' is {repr(winner)[:80]}, not one of first, second, tie")
    return Verdict(winner.strip().lower())


def _logprob(value: Any) -> float | None:
    """A log-probability: a finite number at most 0; None for anything else (1000, NaN, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value > 0:
        return None
    return float(value)


def _token(entry: Any) -> tuple[str, float] | None:
    """(normalised token text, logprob) of one logprobs entry, or None when it is not one."""
    if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
        return None
    lp = _logprob(entry.get("logprob"))
    return None if lp is None else (entry["token"].strip().strip('"').lower(), lp)


def confidence_from_logprobs(logprobs: Any, winner: str | None) -> float | None:
    """P of the winner's token, renormalised over the three answers where the server listed alternatives;
    None when the server's logprobs are not of the OpenAI form, or hold values no log-probability has."""
    if not winner or not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return None
    for entry in logprobs["content"]:
        tok = _token(entry)
        if tok is None:
            return None
        text, lp = tok
        if not text or not winner.startswith(text):
            continue
        alts_in = entry.get("top_logprobs") or []
        alts = [_token(a) for a in alts_in] if isinstance(alts_in, list) else [None]
        if any(a is None for a in alts):
            return None
        mass = {w: math.exp(a_lp) for w in WINNERS for k, a_lp in alts if k and w.startswith(k)}
        p = math.exp(lp)
        total = sum(mass.values()) if mass else 1.0  # no alternatives listed: the token's own probability
        return min(1.0, p / max(total, p))
    return None


def _outcome(row: Any) -> str | None:
    """The video that won (or tie), whatever order it was shown in; None for a row without a verdict or its videos."""
    if not isinstance(row, dict) or row.get("winner") not in WINNERS or row.get("pair_id") is None:
        return None
    first, second = row.get("first"), row.get("second")
    if not isinstance(first, str) or not isinstance(second, str):
        return None
    w = row["winner"]
    return "tie" if w == "tie" else (first if w == "first" else second)


def consistent_outcomes(rows: Iterable[dict]) -> dict[str, dict[str, str | None]]:
    """judge -> pair -> its outcome when both orders were judged and agree (None: judged both ways, disagreeing)."""
    seen: dict[tuple[str, str], dict[str, list[str | None]]] = {}
    for r in rows:
        out = _outcome(r)
        if out is None:
            continue
        seen.setdefault((str(r.get("judge", "")), str(r["pair_id"])), {}).setdefault(str(r.get("order", "")), []).append(out)
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
        if isinstance(r, dict):
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

    where = {str(r["pair_id"]): r for r in rows
             if _outcome(r) is not None and isinstance(r.get("prompt"), str) and isinstance(r.get("context"), str)}
    out: dict[str, list[Any]] = {}
    for judge, outcomes in consistent_outcomes(rows).items():
        for n, (pair, outcome) in enumerate(sorted(outcomes.items())):
            r = where.get(pair)
            if outcome is None or r is None:
                continue
            a, b = r["first"], r["second"]
            chosen, rejected = (a, b) if outcome in ("tie", a) else (b, a)
            out.setdefault(judge, []).append(Pair(n + 1, pair, r["prompt"], r["context"], chosen, rejected, tie=outcome == "tie"))
    return out
