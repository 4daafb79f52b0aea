"""``nvrm serve --record DIR`` as a process: rows written off the request path, contexts stored once,
``--record-mb`` held, and a record that cannot be written never failing a score."""

import time
from pathlib import Path

import pytest

from nvrm import Clip
from nvrm.client import RewardClient
from nvrm.record.reader import read_rows
from nvrm.synth.clips import moving_square
from helpers import Server

pytestmark = pytest.mark.slow

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
BOUND_MB = 0.5


def cands(seed, n=3):
    return [Clip(moving_square(5, 64, 32, seed=seed + i, speed=1 + i), fps=1) for i in range(n)]


def rows_when(root, n, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rows, _ = read_rows(root)
            if len(rows) >= n:
                return rows
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the record at {root} did not reach {n} rows")


def size(root):
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file() and p.name != "record.json")


@pytest.fixture(scope="module")
def served(tiny_bundle, tmp_path_factory):
    root = tmp_path_factory.mktemp("served-record") / "rec"
    s = Server(tiny_bundle, "--record", root, "--record-mb", BOUND_MB)
    yield s, root
    s.stop()


def test_scored_groups_are_recorded_with_one_context_file(served):
    s, root = served
    client = RewardClient(s.url)
    answers = [client.score_group("a square", CTX, cands(10 * k)) for k in range(3)]
    single = client.score("a square", CTX, cands(99, 1)[0])
    rows = rows_when(root, 10)
    assert [r["reward"] for r in rows[:9]] == pytest.approx([x.reward for a in answers for x in a])
    assert rows[9]["reward"] == pytest.approx(single.reward)
    assert len({r["group"] for r in rows}) == 4 and {r["source"] for r in rows} == {"serve"}
    assert {r["revision"] for r in rows} == {"tiny-test-0001"}
    assert len(list((root / "contexts").rglob("*.npy"))) == 1  # four requests, one context
    assert len(list((root / "candidates").rglob("*.npy"))) == 10


def test_the_record_stays_under_record_mb(served):
    s, root = served
    client = RewardClient(s.url)
    for k in range(8):  # 8 x 3 candidates of ~31 KB each: more than the bound
        client.score_group("a square", CTX, cands(1000 + 10 * k))
    rows_when(root, 1)
    time.sleep(1.0)
    rows, _ = read_rows(root)
    assert rows[-1]["reward"] is not None and size(root) <= BOUND_MB * 1024 * 1024
    assert len(list((root / "contexts").rglob("*.npy"))) == 1


def test_a_record_that_cannot_be_written_never_fails_a_score(served):
    s, root = served
    client = RewardClient(s.url)
    (root / "candidates").rename(root.parent / "moved")
    (root / "candidates").write_text("a file where the folder was: every write fails")
    got = [client.score_group("a square", CTX, cands(5000 + 10 * k)) for k in range(3)]
    assert all(len(g) == 3 and all(isinstance(x.reward, float) for x in g) for g in got)
    time.sleep(0.5)
    assert client.score("a square", CTX, cands(7000, 1)[0]).reward is not None
    assert s.output().count("stopped recording") == 1
