"""Durable batch output: torn lines, duplicates, clobbering, CSV/Parquet rendering."""

import json

import pytest

from nvrm import InputError
from nvrm.batch.sink import open_sink, repair_journal


def row(i, k=0, reward=0.5):
    return {"id": f"r{i}", "candidate_index": k, "candidate": "a.mp4", "reward": reward, "error": None,
            "num_tokens": 10, "contract": "c", "model_revision": "v"}


def test_torn_last_line_is_cut_and_its_key_is_not_done(tmp_path):
    out = tmp_path / "s.jsonl"
    out.write_text(json.dumps(row(1)) + "\n" + json.dumps(row(2))[:25])
    sink = open_sink(out, resume=True)
    assert sink.done == {("r1", 0)}
    sink.write([row(2)])
    sink.finish()
    lines = out.read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["r1", "r2"]


def test_refuses_to_clobber_and_to_resume_a_foreign_file(tmp_path):
    out = tmp_path / "s.jsonl"
    out.write_text(json.dumps(row(1)) + "\n")
    with pytest.raises(InputError, match="already exists; pass --resume"):
        open_sink(out)
    out.write_text(json.dumps(row(1)) + "\n" + json.dumps(row(1)) + "\n")
    with pytest.raises(InputError, match="1 duplicated row"):
        open_sink(out, resume=True)
    out.write_text("hello\n" + json.dumps(row(1)) + "\n")
    with pytest.raises(InputError, match="line 1 is not valid JSON"):
        repair_journal(out)
    assert open_sink(out, overwrite=True).done == set()
    with pytest.raises(InputError, match="unknown output format .txt"):
        open_sink(tmp_path / "s.txt")


def test_writing_a_key_twice_is_a_bug_not_a_duplicate_row(tmp_path):
    sink = open_sink(tmp_path / "s.jsonl")
    sink.write([row(1)])
    with pytest.raises(RuntimeError, match="written twice"):
        sink.write([row(1)])
    sink.close()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_csv_and_parquet_are_rendered_from_the_journal_and_resumable(tmp_path, suffix):
    out = tmp_path / f"s{suffix}"
    sink = open_sink(out)
    sink.write([row(1), row(2, reward=None) | {"error": "candidate x: file not found", "num_tokens": None}])
    assert not out.exists() and (tmp_path / f"s{suffix}.journal.jsonl").exists()
    sink.finish()
    assert out.exists() and not (tmp_path / f"s{suffix}.journal.jsonl").exists()
    again = open_sink(out, resume=True)  # a finished job: keys come back from the final file
    assert again.done == {("r1", 0), ("r2", 0)}
    again.write([row(3)])
    again.finish()
    from nvrm.batch.sink import read_final

    rows = read_final(out, suffix[1:])
    assert [(r["id"], r["reward"], r["error"]) for r in rows] == [
        ("r1", 0.5, None), ("r2", None, "candidate x: file not found"), ("r3", 0.5, None)
    ]
