"""The rollout record in process: RL adapters with ``record=DIR``, the writer's bound and failure rule, and
``nvrm prefs pairs --from-record``."""

import json
from pathlib import Path

import numpy as np
import pytest

from nvrm import Clip, make_reward_fn
from nvrm.cli.main import main
from nvrm.record.capture import Recorder, from_rl
from nvrm.record.reader import load_frames, read_rows
from nvrm.synth.clips import moving_square

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
CANDS = [Clip(moving_square(5, 64, 32, seed=10 + i, speed=1 + i), fps=1) for i in range(4)]


def files(root, kind):
    return sorted(p for p in (Path(root) / kind).rglob("*.npy"))


@pytest.fixture(scope="module")
def recorded(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("rec") / "record"
    fn = make_reward_fn(model, record=str(root))
    prompts = ["p"] * 4 + ["q"] * 3
    rewards = fn(prompts, [CTX] * 7, CANDS + CANDS[:3])
    from_rl(str(root)).writer.flush()
    return root, rewards


def test_an_adapter_records_every_item_with_its_reward_and_group(recorded, model):
    root, rewards = recorded
    rows, problems = read_rows(root)
    assert not problems and len(rows) == 7
    assert [r["reward"] for r in rows] == pytest.approx(rewards)
    assert {r["source"] for r in rows} == {"rl"} and {r["revision"] for r in rows} == {model.revision}
    assert [r["prompt"] for r in rows] == ["p"] * 4 + ["q"] * 3
    assert len({r["group"] for r in rows}) == 2 and [r["index"] for r in rows] == [0, 1, 2, 3, 0, 1, 2]
    assert all(r["contract"] == model.fingerprint for r in rows)


def test_one_context_is_stored_once_and_candidates_by_content(recorded):
    root, _ = recorded
    assert len(files(root, "contexts")) == 1  # seven items, two prompts, one context
    assert len(files(root, "candidates")) == 4  # the second group repeats three candidates
    rows, _ = read_rows(root)
    first = load_frames(root, rows[0]["candidate"])
    assert first.dtype == np.uint8 and first.shape == (5, 64, 32, 3) and len(rows[0]["candidate"]["times"]) == 5
    assert np.array_equal(first, CANDS[0].numpy()[[int(round(t)) for t in rows[0]["candidate"]["times"]]])


def test_pairs_from_the_record_in_the_rollouts_pairs_format(recorded, tmp_path, capsys):
    root, rewards = recorded
    out = tmp_path / "pairs.jsonl"
    assert main(["prefs", "pairs", "--from-record", str(root), "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 + 3
    assert set(rows[0]) >= {"pair_id", "rollout", "prompt", "context", "a", "b"}
    assert all(Path(r["a"]).is_file() and Path(r["context"]).is_file() for r in rows)
    least = tmp_path / "least.jsonl"
    assert main(["prefs", "pairs", "--from-record", str(root), "--output", str(least), "--strategy", "uncertain", "--k", "1"]) == 0
    picked = [json.loads(line) for line in least.read_text().splitlines()]
    assert len(picked) == 2
    p = [r for r in picked if r["prompt"] == "p"][0]
    gaps = [abs(rewards[i] - rewards[j]) for i in range(4) for j in range(i + 1, 4)]
    assert abs(p["rewards"][0] - p["rewards"][1]) == pytest.approx(min(gaps))


def test_a_folder_that_is_no_record_is_one_line(tmp_path, capsys):
    assert main(["prefs", "pairs", "--from-record", str(tmp_path), "--output", str(tmp_path / "o.jsonl")]) != 0
    assert "is not an nvrm record" in capsys.readouterr().err


class Result:
    def __init__(self, reward):
        self.reward, self.model_revision = reward, "r1"


def test_the_bound_drops_the_oldest_rows_and_only_their_files(model, tmp_path, monkeypatch):
    monkeypatch.setattr("nvrm.record.writer.SEGMENT_ROWS", 2)
    rec = Recorder(tmp_path / "r", max_mb=0.2)  # ~200 KB: a 2-frame context (6 KB) and a few 5-frame candidates (30 KB each)
    for i in range(12):
        cand = Clip(moving_square(5, 64, 32, seed=100 + i), fps=1)
        rec.offer([("p", CTX, "ctx", cand)], [Result(float(i))], contract=model.contract, limits=model.limits, revision=None)
    rec.writer.flush()
    rows, _ = read_rows(tmp_path / "r")
    assert rec.writer.written == 12 and 0 < len(rows) < 12
    assert [r["reward"] for r in rows] == sorted(r["reward"] for r in rows) and rows[-1]["reward"] == 11.0  # the newest kept
    on_disk = sum(p.stat().st_size for p in (tmp_path / "r").rglob("*") if p.is_file() and p.name != "record.json")
    assert on_disk <= 0.2 * 1024 * 1024 and rec.writer.bytes == on_disk
    assert len(files(tmp_path / "r", "candidates")) == len(rows)
    assert len(files(tmp_path / "r", "contexts")) == 1
    rec.close()


def test_a_write_error_stops_recording_with_one_warning_and_offer_never_raises(model, tmp_path, caplog):
    rec = Recorder(tmp_path / "r")
    rec.offer([("p", CTX, "ctx", CANDS[0])], [Result(1.0)], contract=model.contract, limits=model.limits, revision=None)
    rec.writer.flush()
    (tmp_path / "r" / "candidates").rename(tmp_path / "gone")
    (tmp_path / "r" / "candidates").write_text("a file where the folder was")  # every new candidate write fails
    for i in range(3):
        rec.offer([("p", CTX, "ctx", CANDS[1 + i])], [Result(2.0)], contract=model.contract, limits=model.limits, revision=None)
    rec.writer.flush()
    assert rec.writer.stopped is not None and rec.writer.written == 1
    assert sum("stopped recording" in r.getMessage() for r in caplog.records) == 1
    assert rec.offer([("p", CTX, "ctx", CANDS[0])], [Result(1.0)], contract=model.contract, limits=model.limits, revision=None) == 0
    rec.close()
