"""Turn raw judgments into training pairs (pure; the CLI does the I/O).

A judgment is one comparison shown in one order::

    {"prompt", "context", "first": "a.mp4", "second": "b.mp4", "winner": "first" | "second" | "tie"}

Steps, in order, each removal recorded with its reason:

1. **Unjudged** rows (``nvrm prefs judge`` rows whose answer was unparsed or
   whose request failed: ``winner`` null with ``unparsed`` or ``error``) are
   removed with the judge's reason, and **malformed** rows (missing fields,
   unknown winner, first == second) are removed.
2. **Duplicates**: a judgment identical to an earlier one (same judge, prompt,
   context, order and winner) is removed.
3. **Order consistency**: the judgments of an unordered pair {a, b} within a
   context are grouped. The pair is kept only if it was judged in both
   presentation orders (by at least ``require_judges`` judges, each in both
   orders; rows without a ``judge`` count as one judge) and every judgment names
   the same outcome (the same video wins, or all say tie). Pairs judged in one
   order only, or with disagreeing judgments (one judge's two orders:
   ``inconsistent``; two judges: ``judges_disagree``) are removed.
4. **Cycles**: within each (prompt, context) group the kept preferences form
   a directed graph (winner -> loser). Its strongly connected components are
   found with networkx (Tarjan's algorithm); every preference whose two videos lie in
   the same component is on some cycle and is removed. The preferences left
   form an acyclic graph, and no preference on a cycle survives (the rule
   removes all of a cycle rather than guessing which edge is wrong). Ties are
   not edges and are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

WINNERS = ("first", "second", "tie")


@dataclass(frozen=True)
class Removed:
    reason: str
    """unjudged | malformed | duplicate | one_order_only | too_few_judges | inconsistent | judges_disagree | cycle"""
    detail: str
    item: Any


@dataclass(frozen=True)
class FilterResult:
    pairs: list[dict]
    removed: list[Removed]
    judgments: int

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.removed:
            out[r.reason] = out.get(r.reason, 0) + 1
        return out


def _check(row: Any) -> str | None:
    if not isinstance(row, dict):
        return "not a JSON object"
    if "_error" in row:  # a line the reader could not parse (its own reason)
        return f"line {row.get('_line')}: {row['_error']}"
    for key in ("prompt", "context", "first", "second"):
        if not isinstance(row.get(key), str) or (key != "prompt" and not row.get(key)):
            return f"'{key}' must be a {'string' if key == 'prompt' else 'non-empty path string'}"
    if row.get("winner") not in WINNERS:
        return f"'winner' must be one of {', '.join(WINNERS)}, got {row.get('winner')!r}"
    if row["first"] == row["second"]:
        return "'first' and 'second' are the same video"
    return None


def _outcome(row: dict) -> str:
    """The judged outcome by video, independent of presentation order."""
    if row["winner"] == "tie":
        return "tie"
    return row["first"] if row["winner"] == "first" else row["second"]


def strongly_connected(nodes: list[str], edges: dict[str, list[str]]) -> dict[str, int]:
    """Component id per node of the directed graph ``edges`` (networkx's strongly connected components)."""
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from((v, w) for v, ws in edges.items() for w in ws)
    return {v: k for k, members in enumerate(nx.strongly_connected_components(graph)) for v in members}


def _unjudged(row: Any) -> str | None:
    """Why an ``nvrm prefs judge`` row carries no verdict, or None."""
    if isinstance(row, dict) and row.get("winner") is None and (row.get("unparsed") or row.get("error")):
        who = f"{row.get('pair_id', '?')} {row.get('order', '')} by {row.get('judge', 'the judge')}"
        return f"{who}: {row['error']}" if row.get("error") else f"{who}: unparsed answer ({row['unparsed']})"
    return None


def _pair_verdict(judged: list[dict], label: str, require_judges: int) -> tuple[str, str] | str:
    """(reason, detail) to remove a pair's judgments, or the outcome they agree on."""
    by_judge: dict[str, list[dict]] = {}
    for r in judged:
        by_judge.setdefault(str(r.get("judge") or ""), []).append(r)
    for judge, rs in by_judge.items():
        outcomes = {_outcome(r) for r in rs}
        if len(outcomes) > 1:
            who = f" by {judge}" if judge else ""
            return "inconsistent", f"{label}: judgments{who} disagree ({', '.join(sorted(outcomes))})"
    outcomes = {_outcome(r) for r in judged}
    if len(outcomes) > 1:
        return "judges_disagree", f"{label}: judges disagree ({'; '.join(f'{j}: {_outcome(rs[0])}' for j, rs in sorted(by_judge.items()))})"
    both = [j for j, rs in by_judge.items() if len({(r["first"], r["second"]) for r in rs}) > 1]
    if not both:
        return "one_order_only", f"{label}: judged in one presentation order only"
    if len(both) < require_judges:
        return "too_few_judges", f"{label}: {len(both)} judge(s) judged both orders, {require_judges} required"
    return outcomes.pop()


def filter_judgments(rows: Iterable[Any], require_judges: int = 1) -> FilterResult:
    removed: list[Removed] = []
    seen: set[tuple] = set()
    pairs: dict[tuple, list[dict]] = {}
    n = 0
    for row in rows:
        n += 1
        unjudged = _unjudged(row)
        if unjudged:
            removed.append(Removed("unjudged", unjudged, row))
            continue
        problem = _check(row)
        if problem:
            removed.append(Removed("malformed", problem, row))
            continue
        key = (str(row.get("judge") or ""), row["prompt"], row["context"], row["first"], row["second"], row["winner"])
        if key in seen:
            removed.append(Removed("duplicate", "same judgment seen earlier", row))
            continue
        seen.add(key)
        a, b = sorted((row["first"], row["second"]))
        pairs.setdefault((row["prompt"], row["context"], a, b), []).append(row)

    consistent: dict[tuple, list[tuple[str, str, str]]] = {}  # group -> (a, b, outcome)
    for (prompt, context, a, b), judged in pairs.items():
        verdict = _pair_verdict(judged, f"{a} vs {b} (context {context})", require_judges)
        if isinstance(verdict, tuple):
            removed.append(Removed(verdict[0], verdict[1], judged))
        else:
            consistent.setdefault((prompt, context), []).append((a, b, verdict))

    out: list[dict] = []
    for (prompt, context), prefs in consistent.items():
        edges: dict[str, list[str]] = {}
        nodes: list[str] = []
        for a, b, outcome in prefs:
            for v in (a, b):
                if v not in edges:
                    edges[v] = []
                    nodes.append(v)
            if outcome != "tie":
                loser = b if outcome == a else a
                edges[outcome].append(loser)
        comp = strongly_connected(nodes, edges)
        for a, b, outcome in prefs:
            if outcome == "tie":
                out.append({"prompt": prompt, "context": context, "chosen": a, "rejected": b, "tie": True})
                continue
            loser = b if outcome == a else a
            if comp[outcome] == comp[loser]:
                removed.append(Removed("cycle", f"{outcome} > {loser} (context {context}) lies on a preference cycle", (prompt, context, outcome, loser)))
                continue
            out.append({"prompt": prompt, "context": context, "chosen": outcome, "rejected": loser})
    return FilterResult(out, removed, n)
