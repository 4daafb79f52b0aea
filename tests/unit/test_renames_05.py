"""The 0.5 renames: one sigmoid, one ranking type, the fidelity oracle in ``nvrm.fidelity``; old names warn for one release."""

from __future__ import annotations

import functools
import importlib
import math
import struct
import subprocess
import sys
import warnings

import pytest

TABLE = [0.0, -0.0, 5e-324, -5e-324, 1e-300, -1e-300, 1e-8, -1e-8, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 17.0, -17.0, 36.7, -36.7,
         37.5, -37.5, 100.0, -100.0, 708.9, -708.9, 709.8, -709.8, 710.0, -710.0, 745.2, -745.2, 1e6, -1e6, 1e308, -1e308,
         math.inf, -math.inf]


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def old_scoring_bt(r_a: float, r_b: float) -> float:
    """``scoring/items.py:bt_probability`` before 0.5, kept verbatim as the reference."""
    x = r_a - r_b
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def old_report_sigmoid(x: float) -> float:
    """``report/ranking.py:sigmoid`` before 0.5."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def old_judge_confidence(r1: float, r2: float) -> float:
    """``prefs/judges.py`` (the reward-model judge's confidence) before 0.5."""
    return 1.0 / (1.0 + math.exp(-abs(r1 - r2)))


@pytest.mark.parametrize("x", TABLE)
def test_one_sigmoid_is_bit_identical_to_the_three_it_replaces(x):
    from nvrm.scoring.items import bt_probability, sigmoid

    assert bits(sigmoid(x)) == bits(old_report_sigmoid(x))
    assert bits(sigmoid(abs(x))) == bits(old_judge_confidence(x, 0.0)) == bits(old_judge_confidence(0.0, x))
    for r_b in (0.0, 3.25, -700.0):
        if math.isfinite(x):
            assert bits(bt_probability(x, r_b)) == bits(old_scoring_bt(x, r_b))
    assert 0.0 <= sigmoid(x) <= 1.0


def test_the_sigmoid_never_overflows_and_keeps_nan():
    from nvrm.scoring.items import sigmoid

    assert sigmoid(-1e308) == 0.0 and sigmoid(1e308) == 1.0 and sigmoid(0.0) == 0.5
    assert math.isnan(sigmoid(math.nan))


def test_every_sigmoid_caller_uses_the_one_sigmoid():
    from nvrm.probe import suite
    from nvrm.report import evaluate, ranking
    from nvrm.scoring import items

    assert ranking.sigmoid is items.sigmoid and evaluate.sigmoid is items.sigmoid and suite.sigmoid is items.sigmoid
    src = (importlib.util.find_spec("nvrm.prefs.judges").origin)
    text = open(src).read()
    assert "math.exp" not in text and "sigmoid(" in text


def test_the_judge_confidence_goes_through_the_one_sigmoid(monkeypatch):
    import asyncio

    from nvrm.prefs import judges
    from nvrm.results import ScoreResult

    class Source:
        def score(self, prompts, contexts, candidates):
            return [ScoreResult(r, (), (), 1, "c", None) for r in (800.0, -800.0)], None

    judge = judges.RewardJudge.__new__(judges.RewardJudge)
    judge.source, judge._local = Source(), None
    answer = asyncio.run(judge.compare("p", "c", "a", "b"))
    assert answer.confidence == 1.0 and bits(answer.confidence) == bits(old_judge_confidence(800.0, -800.0))


def test_one_ranking_type():
    from nvrm.report.ranking import pairwise_matrix, rank_rewards
    from nvrm.results import ScoreResult
    from nvrm.scoring.items import RankEntry

    rewards = [0.0, 2.0, 2.0, -1.0]
    ranked = rank_rewards(rewards)
    assert all(type(e) is RankEntry for e in ranked)
    assert [e.index for e in ranked] == [1, 2, 0, 3] and [e.rank for e in ranked] == [1, 2, 3, 4]
    assert ranked[0].p_best_over == 0.5 and ranked[2].p_best_over == pairwise_matrix(rewards)[1][0]
    assert math.fsum(e.p_top for e in ranked) == pytest.approx(1.0) and all(e.result is None for e in ranked)
    results = [ScoreResult(r, (), (), 1, "c", None) for r in rewards]
    with_results = rank_rewards(rewards, results)
    assert [e.result for e in with_results] == [results[e.index] for e in ranked]
    assert [e.reward for e in with_results] == [results[e.index].reward for e in ranked]
    assert rank_rewards([]) == []


def test_ranked_is_the_ranking_type_under_its_old_name_and_warns():
    from nvrm.report import ranking
    from nvrm.scoring.items import RankEntry

    with pytest.warns(DeprecationWarning, match=r"Ranked.*0\.6.*RankEntry"):
        old = ranking.Ranked
    assert old is RankEntry
    with pytest.warns(DeprecationWarning):
        from nvrm.report.ranking import Ranked
    assert Ranked(0, 1, 2.0, 0.5, 1.0).reward == 2.0  # the old positional order still builds an entry
    with pytest.raises(AttributeError):
        ranking.NoSuchName  # noqa: B018


def test_the_fidelity_oracle_lives_in_nvrm_fidelity():
    from pathlib import Path

    import nvrm

    root = Path(nvrm.__file__).parent
    assert (root / "fidelity" / "reference.py").is_file() and (root / "fidelity" / "numerics.py").is_file()
    assert not (root / "bench" / "reference.py").exists() and not (root / "bench" / "numerics.py").exists()
    from nvrm.fidelity import numerics

    assert numerics.bf16_ulp(1.0) == 2.0**-7


OLD = {"nvrm.bench.reference": "nvrm.fidelity.reference", "nvrm.bench.numerics": "nvrm.fidelity.numerics"}


def _old_path_check(old: str) -> str:
    """The body of a function that checks one old path (its three import forms warn, then give the moved module)."""
    leaf = old.rsplit(".", 1)[1]
    return "\n".join("    " + line for line in [
        "warnings.simplefilter('error', DeprecationWarning)",
        f"new = importlib.import_module({OLD[old]!r})",
        "for stmt in (",
        f"    'import {old} as m', 'from nvrm.bench import {leaf} as m', 'from {old} import __name__ as n'):",
        "    try:",
        "        exec(stmt, {})",
        "    except DeprecationWarning as w:",
        "        assert 'nvrm.fidelity' in str(w) and '0.6' in str(w), w",
        "    else:",
        "        raise SystemExit('no warning: ' + stmt)",
        "warnings.simplefilter('ignore', DeprecationWarning)",
        "import nvrm.bench",
        f"ns = {{}}; exec('import {old} as m', ns); assert ns['m'] is new",
        f"assert getattr(nvrm.bench, {leaf!r}) is new",
    ])


@functools.lru_cache(maxsize=None)
def _fresh_interpreter() -> dict[str, str]:
    """Every old path checked in one fresh interpreter (importing ``nvrm.bench`` takes seconds): {old path: "ok" or
    what failed}. The paths are distinct modules, so one check caches nothing another reads."""
    code = ["import importlib, traceback, warnings"]
    for i, old in enumerate(sorted(OLD)):
        code += [f"def check_{i}():", _old_path_check(old), "try:", f"    check_{i}()", f"    print({old!r}, 'ok')",
                 "except BaseException as e:", f"    print({old!r}, repr(traceback.format_exception(e)[-3:]))"]
    out = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0] in OLD)


@pytest.mark.parametrize("old", sorted(OLD))
def test_the_old_oracle_paths_import_with_a_warning(old):
    """``from nvrm.bench.numerics import X``, ``import nvrm.bench.numerics`` and ``from nvrm.bench import numerics``
    all give the moved module, each with a DeprecationWarning; run in a fresh interpreter so nothing is cached."""
    assert _fresh_interpreter().get(old) == "ok", _fresh_interpreter().get(old, "not checked")


def test_nothing_in_the_tree_imports_the_old_oracle_paths():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    hits = []
    for folder in ("src", "tests", "benchmarks"):
        for p in (repo / folder).rglob("*.py"):
            if p.name == Path(__file__).name or "egg-info" in str(p) or p.parent.name in ("bench", "fidelity") and p.name == "__init__.py":
                continue  # the two packages name the old paths to keep them working and to say where they went
            text = p.read_text()
            if any(s in text for s in ("bench.reference", "bench.numerics", "bench import reference", "bench import numerics")):
                hits.append(str(p.relative_to(repo)))
    assert not hits, hits


def test_no_warning_on_the_new_paths():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from nvrm.fidelity import numerics  # noqa: F401
        from nvrm.report.ranking import rank_rewards  # noqa: F401
        from nvrm.scoring.items import RankEntry, sigmoid  # noqa: F401
