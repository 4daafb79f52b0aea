"""``nvrm prefs judge`` against bad input and badly behaved judges (issue 31, item 7): a missing video, an
unreachable judge, an answer in the wrong schema, a judge that times out, answers 500, 429 or 401, refuses
response_format, and a rubric template without its placeholders. Each is a one-line error or a row with
its reason; no row is lost or invented, and --resume finishes what a failure left.

The judges here are small HTTP servers that misbehave on purpose (the well-behaved path runs against
transformers serve in tests/e2e/test_judge.py)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nvrm.cli.main import main

SMALL = ["--max-frames", "1", "--max-context-frames", "0", "--image-height", "32", "--retries", "1"]


class Judge:
    """A chat-completions server whose answer is ``self.answer(body, headers) -> (status, headers, text)``."""

    def __init__(self, answer):
        self.answer = answer
        self.requests: list[dict] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                status, headers, text = judge.answer(body, self.headers)
                data = text.encode()
                try:
                    self.send_response(status)
                    for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def completion(text, usage=None):
    return 200, {}, json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}], **({"usage": usage} if usage else {})})


@pytest.fixture()
def pairs(tmp_path, clips):
    rows = [{"pair_id": "p1", "prompt": "a square moves", "context": str(clips["context"]), "a": str(clips["cand_a"]), "b": str(clips["cand_b"])},
            {"pair_id": "p2", "prompt": "a square moves", "context": str(clips["context"]), "a": str(clips["cand_a"]), "b": str(tmp_path / "gone.mp4")}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def errors(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("nvrm")]


def judge(pairs, out, url, *extra):
    return main(["prefs", "judge", "--pairs", str(pairs), "--output", str(out), "--judge", url, *SMALL, *extra])


def test_a_missing_video_fails_its_rows_and_usage_and_cost_are_counted(pairs, tmp_path, capsys, monkeypatch):
    server = Judge(lambda body, h: completion('{"winner": "first"}', {"prompt_tokens": 1000, "completion_tokens": 7}))
    monkeypatch.setenv("JUDGE_KEY", "sekrit")
    try:
        out = tmp_path / "j.jsonl"
        assert judge(pairs, out, server.url, "--api-key-env", "JUDGE_KEY", "--price-in", "2", "--price-out", "10", "--json") == 0
    finally:
        server.close()
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {(r["pair_id"], r["order"]): r for r in rows_of(out)}
    assert sorted(rows) == [("p1", "ab"), ("p1", "ba"), ("p2", "ab"), ("p2", "ba")]
    assert rows[("p1", "ab")]["winner"] == "first" and rows[("p1", "ba")]["winner"] == "first"
    for order in ("ab", "ba"):
        bad = rows[("p2", order)]
        assert bad["winner"] is None and "gone.mp4" in bad["error"] and "not found" in bad["error"] and bad["raw"] is None
    assert len(server.requests) == 2 and all(r["auth"] == "Bearer sekrit" for r in server.requests)  # no request for the missing video
    assert server.requests[0]["body"]["response_format"]["type"] == "json_schema" and server.requests[0]["body"]["temperature"] == 0.0
    assert summary["tokens"] == {"prompt": 2000, "completion": 14, "answers_without_usage": 0}
    assert summary["cost"] == pytest.approx(2000 * 2 / 1e6 + 14 * 10 / 1e6)
    assert summary["failed"] == 2 and summary["verdicts"] == 2


def test_an_answer_in_the_wrong_schema_is_unparsed_and_refused_response_format_is_dropped(pairs, tmp_path, capsys):
    def answer(body, headers):
        if "response_format" in body:
            return 422, {}, json.dumps({"detail": "Unexpected keys in the request: {'response_format'}"})
        return completion('{"verdict": "A is better"}')

    server = Judge(answer)
    try:
        out = tmp_path / "j.jsonl"
        assert judge(pairs, out, server.url, "--concurrency", "1") == 0
    finally:
        server.close()
    rows = [r for r in rows_of(out) if r["pair_id"] == "p1"]
    assert len(rows) == 2 and all(r["winner"] is None and "'winner' is None" in r["unparsed"] and r["raw"] == '{"verdict": "A is better"}' for r in rows)
    err = errors(capsys)
    assert any("refused response_format (422)" in line for line in err)
    assert sum("response_format" in r["body"] for r in server.requests) == 1  # asked once, then never again this run


def test_a_judge_that_times_out_or_answers_500_writes_nothing_and_resume_finishes(pairs, tmp_path, capsys):
    state = {"mode": "slow"}

    def answer(body, headers):
        if state["mode"] == "slow":
            time.sleep(2.0)
            return completion('{"winner": "second"}')
        if state["mode"] == "500":
            return 500, {"Content-Type": "text/plain"}, "Internal Server Error"
        return completion('{"winner": "second"}')

    server = Judge(answer)
    try:
        out = tmp_path / "j.jsonl"
        assert judge(pairs, out, server.url, "--timeout-s", "0.3") == 1
        err = errors(capsys)
        assert (err[-1].startswith("nvrm prefs judge: 2 judgment(s) could not be made this time (2 x ReadTimeout")
                and err[-1].endswith("run again with --resume"))
        assert {r["pair_id"] for r in rows_of(out)} == {"p2"}  # only the final failures of the missing video
        state["mode"] = "500"
        n = len(server.requests)
        assert judge(pairs, out, server.url, "--resume") == 1
        assert len(server.requests) - n == 2 * 2  # each judgment tried once and retried once (--retries 1)
        assert "the judge answered 500: Internal Server Error (after 2 attempts)" in errors(capsys)[-1]
        state["mode"] = "ok"
        assert judge(pairs, out, server.url, "--resume") == 0
    finally:
        server.close()
    rows = rows_of(out)
    assert sorted((r["pair_id"], r["order"]) for r in rows) == [("p1", "ab"), ("p1", "ba"), ("p2", "ab"), ("p2", "ba")]


def test_429_is_retried_after_its_retry_after_and_401_is_not_a_judgment(pairs, tmp_path, capsys):
    seen = {"n": 0}

    def answer(body, headers):
        seen["n"] += 1
        if seen["n"] == 1:
            return 429, {"Retry-After": "0.2"}, json.dumps({"error": "slow down"})
        return completion('{"winner": "tie"}')

    server = Judge(answer)
    try:
        out = tmp_path / "j.jsonl"
        assert judge(pairs, out, server.url, "--concurrency", "1") == 0
        p1 = [r for r in rows_of(out) if r["pair_id"] == "p1"]
        assert sorted(r["attempts"] for r in p1) == [1, 2] and all(r["winner"] == "tie" for r in p1)
        server.answer = lambda body, headers: (401, {}, json.dumps({"error": "invalid api key"}))
        again = tmp_path / "k.jsonl"
        assert judge(pairs, again, server.url) == 1
        assert {r["pair_id"] for r in rows_of(again)} == {"p2"}  # a wrong key fails no pair
        assert "2 x the judge answered 401" in errors(capsys)[-1]
    finally:
        server.close()


def test_unreachable_judges_bad_rubrics_and_bad_specs_are_one_line_errors(pairs, tmp_path, capsys):
    from helpers import free_port

    out = tmp_path / "j.jsonl"
    assert judge(pairs, out, f"http://127.0.0.1:{free_port()}/v1") == 2
    [line] = errors(capsys)
    assert "cannot be reached" in line and "ConnectionRefusedError" in line
    rubric = tmp_path / "r.txt"
    rubric.write_text("Which is better, {first} or the other one?")
    assert judge(pairs, out, "http://127.0.0.1:9/v1", "--rubric", str(rubric)) == 2
    [line] = errors(capsys)
    assert str(rubric) in line and r"lacks {prompt}, {second}" in line
    assert judge(pairs, out, "ftp://somewhere") == 2
    [line] = errors(capsys)
    assert "--judge ftp://somewhere" in line
    assert main(["prefs", "judge", "--pairs", str(pairs), "--output", str(out), "--judge", "http://127.0.0.1:9/v1", "--concurrency", "0"]) == 2
    assert "--concurrency 0: out of range" in errors(capsys)[0]
    assert not out.exists() or not out.read_text()


def test_a_bad_pairs_line_is_named_and_the_rest_is_judged(pairs, tmp_path, capsys):
    with pairs.open("a") as f:
        f.write('{"pair_id": "p1", "prompt": "x", "context": "c.mp4", "a": "a.mp4", "b": "b.mp4"}\n{"prompt": "no id"}\nnot json\n')
    server = Judge(lambda body, h: completion('{"winner": "first"}'))
    try:
        out = tmp_path / "j.jsonl"
        assert judge(pairs, out, server.url) == 0
    finally:
        server.close()
    err = errors(capsys)
    assert any("line 3: pair_id 'p1' appears twice" in e for e in err) and any("line 4: 'pair_id' must be" in e for e in err)
    assert any("line 5:" in e for e in err)
    assert len(rows_of(out)) == 4
