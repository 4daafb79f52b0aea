"""Judgment filtering: order consistency, cycles, duplicates (pure)."""

from nvrm.prefs.filter import filter_judgments, strongly_connected


def j(first, second, winner, ctx="c.mp4", prompt="p"):
    return {"prompt": prompt, "context": ctx, "first": first, "second": second, "winner": winner}


def both(a, b, winner_video):
    """Judged in both orders, agreeing that ``winner_video`` wins."""
    return [j(a, b, "first" if winner_video == a else "second"), j(b, a, "first" if winner_video == b else "second")]


def pairs_of(result):
    return sorted((p["chosen"], p["rejected"], p.get("tie", False)) for p in result.pairs)


def test_order_consistent_pairs_are_kept_and_inconsistent_ones_removed():
    rows = both("a", "b", "a") + [j("a", "c", "first"), j("c", "a", "first")] + [j("a", "d", "first")]
    rows += [j("e", "f", "tie"), j("f", "e", "tie")]
    r = filter_judgments(rows)
    assert pairs_of(r) == [("a", "b", False), ("e", "f", True)]
    assert r.counts() == {"inconsistent": 1, "one_order_only": 1}
    assert any("a vs c" in x.detail and "disagree" in x.detail for x in r.removed)


def test_a_three_cycle_is_removed_and_a_chain_is_kept():
    rows = both("a", "b", "a") + both("b", "c", "b") + both("c", "a", "c")  # a > b > c > a
    rows += both("x", "y", "x") + both("y", "z", "y") + both("x", "z", "x")  # a chain: consistent order
    r = filter_judgments(rows)
    assert pairs_of(r) == [("x", "y", False), ("x", "z", False), ("y", "z", False)]
    assert r.counts() == {"cycle": 3}


def test_cycles_are_per_context_and_prompt():
    rows = both("a", "b", "a") + [j("a", "b", "second", ctx="other"), j("b", "a", "first", ctx="other")]
    r = filter_judgments(rows)
    assert len(r.pairs) == 2 and not r.removed  # a > b in one context, b > a in another: no cycle


def test_duplicates_and_malformed_rows_are_removed_with_reasons():
    rows = both("a", "b", "b") + [j("a", "b", "second"), {"prompt": "p"}, j("a", "a", "first"), j("a", "b", "maybe")]
    r = filter_judgments(rows)
    assert pairs_of(r) == [("b", "a", False)]
    assert r.counts() == {"duplicate": 1, "malformed": 3}
    assert r.judgments == 6


def test_tarjan_components():
    comp = strongly_connected(["a", "b", "c", "d"], {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": []})
    assert comp["a"] == comp["b"] == comp["c"] != comp["d"]
