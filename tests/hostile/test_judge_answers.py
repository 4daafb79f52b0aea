"""``nvrm prefs judge`` against judge servers whose answers are hostile or malformed (issue 43, items 4 and 13-19):
a gzip bomb, an answer too long to keep, answers of the wrong shape, a server trickling one byte at a time,
HTML, empty and redirect answers, negative token counts and a foreign ``nvrm_confidence``, duplicate
``winner`` keys, a pairs line nested 100,000 deep, and journal rows without ``first``.

Each bad answer is one row with its reason (or, when it says nothing about the pair, no row and a
``--resume`` that asks again); none crashes the run. The servers are ``RawJudge`` (tests/judge_server.py):
they send exactly the bytes a test gives them."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from judge_server import RawJudge
from nvrm.cli.main import main

SMALL = ["--max-frames", "1", "--max-context-frames", "0", "--image-height", "32", "--retries", "0"]
VERDICT = '{"winner": "first"}'


def completion(content, usage=None, logprobs=None) -> dict:
    choice = {"message": {"role": "assistant", "content": content}, **({"logprobs": logprobs} if logprobs is not None else {})}
    return {"choices": [choice], **({"usage": usage} if usage is not None else {})}


def reply(obj, status=200, headers=None, trickle_s=0.0):
    data = obj if isinstance(obj, bytes) else (obj.encode() if isinstance(obj, str) else json.dumps(obj).encode())
    return lambda body: (status, headers or {}, data, trickle_s)


@pytest.fixture()
def pairs(tmp_path, clips):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"pair_id": "p1", "prompt": "a square moves", "context": str(clips["context"]), "a": str(clips["cand_a"]),
                                "b": str(clips["cand_b"])}) + "\n")
    return path


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def judge(pairs, out, url, *extra):
    return main(["prefs", "judge", "--pairs", str(pairs), "--output", str(out), "--judge", url, *SMALL, *extra])


def run_against(answer, pairs, out, *extra):
    server = RawJudge(answer)
    try:
        return judge(pairs, out, server.url, *extra), server
    finally:
        server.close()


# item 4: a gzip bomb is cut off while it streams; a long answer is kept as an excerpt
@pytest.mark.parametrize("data,headers,extra", [
    (gzip.compress(json.dumps(completion(VERDICT + " " * (16 << 20))).encode(), 9), {"Content-Encoding": "gzip"}, ()),
    (json.dumps(completion(VERDICT + " " * (200 << 10))).encode(), {}, ("--max-answer-kb", "64")),
], ids=["gzip-16MB-default-bound", "plain-200KB-bound-64KB"])
def test_an_answer_larger_than_max_answer_kb_fails_its_row_without_being_read_whole(pairs, tmp_path, data, headers, extra):
    out = tmp_path / "j.jsonl"
    rc, _ = run_against(reply(data, headers=headers), pairs, out, *extra)
    assert rc == 0
    rows = rows_of(out)
    assert len(rows) == 2 and all(r["winner"] is None and "--max-answer-kb" in (r["error"] or "") for r in rows), rows[0]["error"]
    assert out.stat().st_size < 16 << 10


def test_a_bomb_decodes_to_no_more_than_the_bound_whatever_its_ratio():
    from nvrm.remote.exchange import BoundedBody

    bomb = gzip.compress(b"\0" * (150 << 20), 9)  # about 150 KB that inflate to 150 MB
    got = BoundedBody("gzip", 64 << 10)
    for i in range(0, len(bomb), 65536):
        got.feed(bomb[i : i + 65536])
        assert got.size <= 64 << 10
        if got.done:
            break
    assert got.too_large and got.size == 64 << 10 and got.error is None


def test_a_long_answer_is_stored_as_a_bounded_excerpt(pairs, tmp_path):
    out = tmp_path / "j.jsonl"
    rc, _ = run_against(reply(completion("x " * 100_000)), pairs, out)
    assert rc == 0
    rows = rows_of(out)
    assert len(rows) == 2 and all(r["winner"] is None and r["unparsed"] for r in rows)
    assert all(len(r["raw"]) <= 4096 and r["raw"].startswith("x x") and r["raw_chars"] == 200_000 for r in rows)
    assert out.stat().st_size < 32 << 10


# a judge that loads its model on first use (transformers serve does, in every request that finds it missing, and
# loads at once break one another: CI saw 500 on every request): the run's first request goes alone
@pytest.mark.parametrize("first_status", [200, 500])
def test_the_first_request_goes_alone_then_the_rest_at_concurrency(tmp_path, clips, first_status):
    import threading

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"pair_id": f"p{i}", "prompt": "a square moves", "context": str(clips["context"]),
                                         "a": str(clips["cand_a"]), "b": str(clips["cand_b"])}) + "\n" for i in range(4)))
    lock, log, open_now, most = threading.Lock(), [], [0], [0]

    def answer(body):
        with lock:
            n = len(log)
            log.append([time.monotonic(), None])
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
        time.sleep(0.6 if n == 0 else 1.0)  # long enough for 4 to be open at once on a loaded machine
        with lock:
            log[n][1] = time.monotonic()
            open_now[0] -= 1
        status = first_status if n == 0 else 200
        return status, {}, json.dumps(completion(VERDICT)).encode(), 0.0

    out = tmp_path / "j.jsonl"
    rc, _ = run_against(answer, pairs, out, "--concurrency", "4")
    first_done = log[0][1]
    assert len(log) == 8 and all(arrived >= first_done for arrived, _ in log[1:]), log
    assert most[0] == 4  # after the first, the rest go at --concurrency
    rows = rows_of(out)
    assert rc == (0 if first_status == 200 else 1) and len(rows) == (8 if first_status == 200 else 7)
    assert all(r["winner"] == "first" for r in rows)


# item 13: answers of the wrong shape are one row each, with the reason
SSE = {"Content-Type": "text/event-stream"}
PARTS = [{"type": "text", "text": '{"winner": '}, {"type": "text", "text": '"second"}'}]
SHAPES = {
    "choices-as-strings": ({"choices": ["first"]}, {}, "error", "choices"),
    "message-not-an-object": ({"choices": [{"message": "first"}]}, {}, "error", "message"),
    "message-a-list": ({"choices": [{"message": [1]}]}, {}, "error", "message"),
    "content-text-parts": (completion(PARTS), {}, "second", None),
    "content-a-number": (completion(7), {}, "error", "content"),
    "content-an-object": (completion({"winner": "first"}), {}, "error", "content"),
    "content-nested-deep": (completion("[" * 100_000 + "]" * 100_000), {}, "unparsed", None),
    "body-nested-deep": ("[" * 100_000 + "]" * 100_000, {}, "error", "nested"),
    "body-a-list": ([1, 2], {}, "error", "not a chat completion"),
    "usage-a-string": (completion(VERDICT, usage="lots"), {}, "first", None),
    "usage-nan": (json.dumps(completion(VERDICT)).rstrip("}") + ', "usage": {"prompt_tokens": NaN, "completion_tokens": 3}}', {},
                  "first", None),
    "usage-nan-itself": (json.dumps(completion(VERDICT)).rstrip("}") + ', "usage": NaN}', {}, "first", None),
    "usage-huge": (completion(VERDICT, usage={"prompt_tokens": 10 ** 400, "completion_tokens": 1}), {}, "first", None),
    "sse-list-chunks": ("data: [1, 2]\n\ndata: [DONE]\n\n", SSE, "error", "stream"),
    "sse-numeric-delta": ('data: {"choices": [{"delta": 7}]}\n\ndata: [DONE]\n\n', SSE, "error", "delta"),
    "sse-numeric-content": ('data: {"choices": [{"delta": {"content": 7}}]}\n\ndata: [DONE]\n\n', SSE, "error", "content"),
    "sse-choice-a-string": ('data: {"choices": ["first"]}\n\ndata: [DONE]\n\n', SSE, "error", "choice"),
    "sse-usage-a-string": ('data: {"choices": [{"delta": {"content": "first"}}], "usage": "x"}\n\ndata: [DONE]\n\n', SSE, "first", None),
    "logprobs-1000-not-asked": (completion(VERDICT, logprobs={"content": [{"token": "first", "logprob": 1000}]}), {}, "first", None),
    "logprobs-string-tokens": (completion(VERDICT, logprobs={"content": ["first", 3]}), {}, "first", None),
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_an_answer_of_the_wrong_shape_is_one_row_with_its_reason(pairs, tmp_path, capsys, case):
    obj, headers, expect, reason = SHAPES[case]
    out = tmp_path / "j.jsonl"
    rc, _ = run_against(reply(obj, headers=headers), pairs, out, "--json")
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = rows_of(out)
    assert len(rows) == 2
    for r in rows:
        if expect == "error":
            assert r["winner"] is None and reason in r["error"], r["error"]
        elif expect == "unparsed":
            assert r["winner"] is None and r["error"] is None and r["unparsed"]
        else:
            assert r["winner"] == expect and r["error"] is None and r["confidence"] is None
            assert r["usage"] is None or all(isinstance(v, int) and v >= 0 for v in r["usage"].values())
    if case.startswith("usage") or case == "sse-usage-a-string":
        assert summary["tokens"] == {"prompt": 0, "completion": 0, "answers_without_usage": 2}
    assert out.read_text().count("NaN") == 0


@pytest.mark.parametrize("logprobs", [
    {"content": [{"token": "first", "logprob": 1000}]},
    {"content": [{"token": "first", "logprob": -0.1, "top_logprobs": ["first", {"token": "second", "logprob": "x"}]}]},
    {"content": [{"token": 5, "logprob": float("nan")}]},
    {"content": [{"token": "first", "logprob": -0.1, "top_logprobs": [{"token": "first", "logprob": 900}]}]},
], ids=["1000", "string-alternatives", "nan", "alternative-900"])
def test_asked_for_logprobs_nonsense_ones_give_no_confidence_and_no_crash(pairs, tmp_path, logprobs):
    out = tmp_path / "j.jsonl"
    data = json.dumps(completion(VERDICT, logprobs=logprobs))
    rc, server = run_against(reply(data), pairs, out, "--logprobs")
    assert rc == 0 and server.requests[0]["logprobs"] is True
    rows = rows_of(out)
    assert len(rows) == 2 and all(r["winner"] == "first" and r["confidence"] is None for r in rows)


# item 14: --timeout-s bounds a whole request, also one trickling a byte at a time
def test_a_trickling_answer_is_cut_at_timeout_s_and_never_a_verdict(pairs, tmp_path, capsys):
    out = tmp_path / "j.jsonl"
    t0 = time.monotonic()
    rc, server = run_against(reply(completion(VERDICT), trickle_s=0.1), pairs, out, "--timeout-s", "1")
    took = time.monotonic() - t0
    assert rc == 1 and rows_of(out) == []  # not written: --resume asks again
    assert took < 5.0, f"{took:.1f} s for two requests under --timeout-s 1"
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("nvrm")]
    assert "--timeout-s" in err[-1] and "run again with --resume" in err[-1]


# item 15: HTML, empty 200 and redirect answers are not the pair's answer: --resume asks them again
@pytest.mark.parametrize("status,headers,data", [
    (200, {"Content-Type": "text/html"}, b"<!DOCTYPE html><html><body>Sign in to continue</body></html>"),
    (200, {}, b""),
    (200, {"Content-Type": "text/plain"}, b"   \n"),
    (307, {"Location": "http://127.0.0.1:9/v1/chat/completions"}, b""),
], ids=["html", "empty", "blank", "307"])
def test_html_empty_and_redirect_answers_are_asked_again_by_resume(pairs, tmp_path, status, headers, data):
    out = tmp_path / "j.jsonl"
    rc, _ = run_against(lambda body: (status, headers, data, 0.0), pairs, out)
    assert rc == 1 and rows_of(out) == []
    rc, _ = run_against(reply(completion(VERDICT)), pairs, out, "--resume")
    assert rc == 0 and sorted(r["winner"] for r in rows_of(out)) == ["first", "first"]


# item 16: negative token counts are not counted; nvrm_confidence is nvrm's own judge's only
def test_negative_tokens_are_not_summed_and_a_server_cannot_set_nvrm_confidence(pairs, tmp_path, capsys):
    out = tmp_path / "j.jsonl"
    answer = completion(VERDICT, usage={"prompt_tokens": -1_000_000, "completion_tokens": 5}, logprobs={"nvrm_confidence": 0.99})
    rc, _ = run_against(reply(answer), pairs, out, "--price-in", "2", "--price-out", "10", "--json")
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["tokens"] == {"prompt": 0, "completion": 0, "answers_without_usage": 2} and summary["cost"] == 0
    rows = rows_of(out)
    assert all(r["winner"] == "first" and r["confidence"] is None and r["usage"] is None for r in rows)


# item 17: duplicate keys make a verdict ambiguous
def test_duplicate_winner_keys_are_unparsed(pairs, tmp_path):
    from nvrm.prefs.verdict import parse_verdict

    out = tmp_path / "j.jsonl"
    rc, _ = run_against(reply(completion('{"winner": "first", "winner": "second"}')), pairs, out)
    assert rc == 0
    rows = rows_of(out)
    assert len(rows) == 2 and all(r["winner"] is None and "winner" in r["unparsed"] and "twice" in r["unparsed"] for r in rows)
    assert parse_verdict('Here: {"winner": "tie", "winner": "first"}').winner is None
    assert parse_verdict('```json\n{"winner": "second"}\n```').winner == "second"


# item 18: one pairs line nested 100,000 deep is one bad line
def test_a_pairs_line_nested_deep_is_one_bad_line(pairs, tmp_path, capsys):
    from nvrm.prefs.pairs import PairProblem, read_pairs

    with pairs.open("a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    out = tmp_path / "j.jsonl"
    rc, _ = run_against(reply(completion(VERDICT)), pairs, out)
    assert rc == 0 and len(rows_of(out)) == 2
    err = capsys.readouterr().err
    assert "line 2:" in err and "nested" in err
    deep = tmp_path / "train_pairs.jsonl"
    good = '{"prompt": "p", "context": "c.mp4", "chosen": "a.mp4", "rejected": "b.mp4"}\n'
    deep.write_text(good + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n")
    rows = read_pairs(deep)
    assert len(rows) == 2 and not isinstance(rows[0], PairProblem) and isinstance(rows[1], PairProblem) and "nested" in rows[1].message


# item 19: the agreement code takes rows without first (or second) without a KeyError
def test_journal_rows_without_first_do_not_break_the_agreement(pairs, tmp_path, capsys):
    from nvrm.prefs.verdict import agreement, judged_pairs

    foreign = [{"pair_id": "q1", "order": o, "judge": "other", "winner": "first", "second": "b.mp4"} for o in ("ab", "ba")]
    out = tmp_path / "j.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in foreign))
    rc, _ = run_against(reply(completion(VERDICT)), pairs, out, "--resume", "--json")
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["agreement"]["per_judge"]["other"] == {"pairs_both_orders": 0, "order_consistency": None}
    assert agreement(foreign)["per_judge"]["other"]["pairs_both_orders"] == 0
    assert judged_pairs(foreign + [{"pair_id": "q2", "order": "ab", "judge": "other", "winner": "first", "first": "a.mp4"}]) == {}
