"""Manifest parsing and resume planning for nvrm batch (pure)."""

import json
from pathlib import Path

import pytest

from nvrm import InputError
from nvrm.batch.runner import LocalExecutor
from nvrm.batch.manifest import ManifestRow, RowProblem, parse_line, pending, read_manifest as read_job_manifest

BASE = Path("/data/m")


def test_single_and_group_rows_resolve_relative_paths():
    single = parse_line(json.dumps({"id": 7, "prompt": "p", "context": "c.mp4", "candidate": "/abs/a.mp4"}), 1, BASE)
    assert isinstance(single, ManifestRow) and not single.group
    assert (single.id, single.context, single.candidates, single.labels) == ("7", "/data/m/c.mp4", ("/abs/a.mp4",), ("/abs/a.mp4",))
    group = parse_line(json.dumps({"id": "g", "prompt": "p", "context": "c.mp4", "candidates": ["a.mp4", "sub/b.mp4"]}), 2, BASE)
    assert group.group and group.candidates == ("/data/m/a.mp4", "/data/m/sub/b.mp4") and group.keys() == [("g", 0), ("g", 1)]


@pytest.mark.parametrize(
    "text,rid,n,needle",
    [
        ("{oops", "line:3", 1, "not valid JSON"),
        ("[1, 2]", "line:3", 1, "expected a JSON object"),
        ('{"prompt": "p", "context": "c", "candidate": "a"}', "line:3", 1, "'id' must be"),
        ('{"id": "x", "context": "c", "candidate": "a"}', "x", 1, "'prompt' must be a string"),
        ('{"id": "x", "prompt": "p", "candidate": "a"}', "x", 1, "'context' must be"),
        ('{"id": "x", "prompt": "p", "context": "c", "candidates": []}', "x", 1, "non-empty list"),
        ('{"id": "x", "prompt": "p", "context": "c", "candidates": ["a", 5, "b"]}', "x", 3, "'candidates[1]'"),
        ('{"id": "x", "prompt": "p", "context": "c", "candidate": "a", "candidates": ["b"]}', "x", 1, "not both"),
    ],
)
def test_bad_lines_become_problems_that_keep_their_rows(text, rid, n, needle):
    r = parse_line(text, 3, BASE)
    assert isinstance(r, RowProblem)
    assert (r.id, len(r.keys())) == (rid, n)
    assert r.message.startswith("manifest line 3: ") and needle in r.message


def test_duplicate_ids_are_refused_naming_both_lines(tmp_path):
    m = tmp_path / "m.jsonl"
    row = {"id": "a", "prompt": "p", "context": "c", "candidate": "x"}
    m.write_text(json.dumps(row) + "\n\n" + json.dumps(row) + "\n")
    with pytest.raises(InputError, match=r"id 'a' appears on lines 1 and 3"):
        read_job_manifest(m)
    with pytest.raises(InputError, match="manifest not found"):
        read_job_manifest(tmp_path / "nope.jsonl")


def test_pending_skips_done_keys_and_keeps_partial_groups():
    rows = [
        parse_line(json.dumps({"id": "a", "prompt": "p", "context": "c", "candidate": "x"}), 1, BASE),
        parse_line(json.dumps({"id": "g", "prompt": "p", "context": "c", "candidates": ["x", "y", "z"]}), 2, BASE),
        parse_line("{bad", 3, BASE),
    ]
    units, skipped = pending(rows, {("a", 0), ("g", 1)})
    assert skipped == 2
    assert [(u.row.id, u.indices) for u in units] == [("g", (0, 2)), ("line:3", (0,))]


class FakeModel:
    """Records how the executor calls the model; rewards are the candidate's length."""

    fingerprint = "f" * 64
    revision = "r1"

    def __init__(self):
        self.calls = []

    def score_groups(self, groups, errors="return"):
        groups = list(groups)
        self.calls.append(("groups", [g[0] for g in groups]))
        from nvrm.results import ScoreResult

        return iter([[ScoreResult(float(len(c)), (), (), 1, "f", "r1") for c in g[2]] for g in groups])

    def score_batch(self, items, errors="return"):
        from nvrm.results import ScoreResult

        self.calls.append(("batch", [it[2] for it in items]))
        return [ScoreResult(float(len(it[2])), (), (), 1, "f", "r1") for it in items]


def test_local_executor_streams_group_runs_and_batches_single_runs():
    rows = [parse_line(json.dumps({"id": f"s{i}", "prompt": "p", "context": "c", "candidate": "x" * (i + 1)}), i, BASE) for i in range(3)]
    rows.insert(1, parse_line(json.dumps({"id": "g", "prompt": "pg", "context": "c", "candidates": ["a", "bb", "ccc"]}), 9, BASE))
    rows.insert(2, parse_line(json.dumps({"id": "h", "prompt": "ph", "context": "c", "candidates": ["a"]}), 10, BASE))
    rows.append(parse_line("{bad", 11, BASE))
    units, _ = pending(rows, {("g", 1)})
    model = FakeModel()
    out = [r for chunk in LocalExecutor(model, batch_rows=2).rows(units) for r in chunk]
    keys = [(r["id"], r["candidate_index"]) for r in out]
    assert sorted(keys) == sorted({("s0", 0), ("g", 0), ("g", 2), ("h", 0), ("s1", 0), ("s2", 0), ("line:11", 0)})
    assert len(keys) == len(set(keys))  # every row exactly once
    assert model.calls[0] == ("batch", ["/data/m/x"]) and model.calls[1] == ("groups", ["pg", "ph"])  # one stream for the run
    assert model.calls[2] == ("batch", ["/data/m/xx", "/data/m/xxx"])
    bad = [r for r in out if r["id"] == "line:11"][0]
    assert bad["reward"] is None and "not valid JSON" in bad["error"]
