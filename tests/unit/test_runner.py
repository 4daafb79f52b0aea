"""The batch job runner's fallbacks keep every row and its own error."""

from __future__ import annotations

from nvrm.errors import InputError
from nvrm.batch.manifest import ManifestRow, Unit
from nvrm.batch.runner import LocalExecutor


class _Result:
    def __init__(self, reward):
        self.reward, self.num_tokens = reward, 10


class BrokenModel:
    """score_groups breaks after the first group; each group alone then fails its own way (or not)."""

    fingerprint, revision = "fp", "rev"

    def score_groups(self, stream, errors):
        for k, (prompt, ctx, cands) in enumerate(stream):
            if k == 1:
                raise RuntimeError("the stream broke")
            yield [_Result(1.0) for _ in cands]

    def score_group(self, prompt, context, candidates, errors):
        if prompt == "bad input":
            raise InputError(context, "unreadable")
        if prompt == "bug":
            raise ZeroDivisionError("this group's own bug")
        return [_Result(2.0) for _ in candidates]


def unit(i, prompt, n=2):
    row = ManifestRow(i, f"r{i}", prompt, f"ctx{i}.mp4", tuple(f"c{j}.mp4" for j in range(n)), tuple(f"c{j}.mp4" for j in range(n)), True)
    return Unit(row, tuple(range(n)))


def test_after_the_stream_fails_each_group_gets_its_own_outcome(caplog):
    units = [unit(0, "fine"), unit(1, "fine"), unit(2, "bad input"), unit(3, "bug"), unit(4, "fine")]
    rows = [r for batch in LocalExecutor(BrokenModel()).rows(units) for r in batch]
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(5) for _ in range(2)]  # every row once, in order
    by_id = {r["id"]: r for r in rows}
    assert by_id["r0"]["reward"] == 1.0 and by_id["r1"]["reward"] == 2.0 and by_id["r4"]["reward"] == 2.0
    assert "unreadable" in by_id["r2"]["error"]
    assert "this group's own bug" in by_id["r3"]["error"] and "stream broke" not in by_id["r3"]["error"]
    assert any("group r3 failed on its own" in m for m in caplog.messages)
