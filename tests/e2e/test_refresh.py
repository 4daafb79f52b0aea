"""``nvrm refresh``: one cycle on the tiny bundle, from a record of synthetic moving-square rollouts, judged by an
ORACLE judge, then resumed.

The judge here is NOT a vision-language model: it is a tiny OpenAI-compatible chat server that answers from the
synthetic task's ground truth (the preferred continuation > reverse > teleport > freeze). It recognises each
candidate by its images: the judge contract turns each of the cycle's videos into the very same data URLs the
cycle sends, so the oracle looks them up in a table it builds from the cycle folder and the record's rows.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nvrm import Clip, make_reward_fn
from nvrm.cli.main import main
from nvrm.prefs.judge_contract import JudgeContract, video_images
from nvrm.prefs.synthetic import PROMPT, SynthSpec, make_example
from nvrm.record.capture import from_rl
from nvrm.record.reader import read_rows
from nvrm.refresh import RefreshConfig, run_cycle
from nvrm.train.config import TrainConfig

pytestmark = pytest.mark.slow

KINDS = ("preferred", "reverse", "teleport", "freeze")
QUALITY = {"preferred": 3, "reverse": 2, "teleport": 1, "freeze": 0}
"""The oracle's ground truth: the right motion first, then less and less of it."""
CONTRACT = JudgeContract(max_context_frames=0)
FIGURES: dict = {}
"""The uninterrupted cycle's gate figures, which the killed-and-resumed cycle must reproduce."""


def refresh_argv(recorded, bundle, cycle, url):
    return ["refresh", "--record", str(recorded), "--from", str(bundle), "--cycle", str(cycle), "--judge", url,
            "--pairs-per-cycle", "12", "--holdout", "0.25", "--epochs", "1", "--batch-pairs", "4", "--lora-rank", "4",
            "--max-context-frames", "0", "--device", "cpu", "--probe-contexts", "2", "--probe-perturbations", PROBES]


PROBES = "freeze,reverse,shift"
CONFIG = RefreshConfig(pairs_per_cycle=12, holdout=0.25, probe_contexts=2, probe_perturbations=PROBES)
"""What ``refresh_argv`` asks for, as ``run_cycle`` takes it."""


def shown_videos(body: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The two videos a judge request shows (the last two runs of image parts), each as its image URLs."""
    groups, current = [], None
    for part in body["messages"][0]["content"]:
        if part["type"] == "image_url":
            if current is None:
                current = []
                groups.append(current)
            current.append(part["image_url"]["url"])
        else:
            current = None
    first, second = groups[-2:]
    return tuple(first), tuple(second)


class Oracle:
    """Answers ``{"winner": ...}`` from the ground truth of the videos it is shown (see the module doc)."""

    def __init__(self, record: Path, cycle: Path, delay: float = 0.0):
        self.record, self.cycle, self.table = record, cycle, None
        self.asked, self.delay = 0, delay

    def quality(self, urls: tuple[str, ...]) -> int:
        if self.table is None:  # built on the first question, once the cycle has written its videos
            rows, _ = read_rows(self.record)
            kind_of = {r["candidate"]["key"]: KINDS[r["index"]] for r in rows}
            self.table = {tuple(video_images(str(p), "candidate", CONTRACT)): QUALITY[kind_of[p.stem]]
                          for p in (self.cycle / "record" / "media").glob("*.mp4") if p.stem in kind_of}
        return self.table[urls]

    def answer(self, body: dict) -> str:
        first, second = (self.quality(v) for v in shown_videos(body))
        self.asked += 1
        time.sleep(self.delay)
        return "first" if first > second else "second" if second > first else "tie"


def serve_oracle(oracle: Oracle) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            out = json.dumps({"choices": [{"message": {"role": "assistant", "content": json.dumps({"winner": oracle.answer(body)})}}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


@pytest.fixture(scope="module")
def recorded(model, tmp_path_factory):
    """A record of four request groups: one context, its four continuations (each kind once), scored by the tiny model."""
    root = tmp_path_factory.mktemp("refresh") / "record"
    fn = make_reward_fn(model, record=str(root))
    spec = SynthSpec()
    for seed in range(4):
        ex = make_example(seed, spec)
        ctx = Clip(ex["context"], fps=spec.fps)
        fn([PROMPT] * 4, [ctx] * 4, [Clip(ex[k], fps=spec.fps) for k in KINDS])
    from_rl(str(root)).writer.flush()
    return root


def test_one_cycle_gates_and_resumes_only_what_is_missing(recorded, tiny_bundle, tmp_path, capsys, monkeypatch):
    cycle = tmp_path / "cycle"
    oracle = Oracle(recorded, cycle)
    server, url = serve_oracle(oracle)
    try:
        rc = main(refresh_argv(recorded, tiny_bundle, cycle, url))
        cap = capsys.readouterr()
        report = json.loads((cycle / "gate" / "gate.json").read_text())
        assert (cycle / "gate" / "gate.html").is_file()
        held = report["checks"]["holdout"]
        for side in ("current", "candidate"):  # both agreements, each with its interval
            assert held[side]["n"] >= 1 and 0 <= held[side]["accuracy"] <= 1
            lo, hi = held[side]["interval95"]
            assert lo <= held[side]["accuracy"] <= hi
        assert report["checks"]["rewards"]["passed"], report["checks"]["rewards"]["why"]
        probe = report["checks"]["probe"]  # nvrm probe on two recorded contexts, both models, side by side
        assert probe["clips"] == 2 and report["not_checked"] == [] and len(report["probe"]["clips"]) == 2
        for side in ("current", "candidate"):
            assert set(report["probe"][side]) == set(PROBES.split(",")) and all(f["clips"] == 2 for f in report["probe"][side].values())
            assert probe[f"{side}_flagged"] == sorted(n for n, f in report["probe"][side].items() if f["flagged"])
        assert probe["passed"] == (not set(probe["candidate_flagged"]) - set(probe["current_flagged"]))
        assert "nvrm probe on 2 recorded context(s)" in (cycle / "gate" / "gate.html").read_text()
        FIGURES.update(held=held, passed=report["passed"], checks=report["checks"])
        print(f"held-out agreement: current {held['current']['accuracy']}, candidate {held['candidate']['accuracy']}, "
              f"gate {report['passed']}")
        assert rc == (0 if report["passed"] else 1)
        assert (cycle / "export" / "bundle").is_dir() == report["passed"]
        if not report["passed"]:
            assert "gate failed, nothing exported" in cap.err and len(cap.err.strip().splitlines()[-1:]) == 1
        pairs = [json.loads(x) for x in (cycle / "pairs" / "pairs.jsonl").read_text().splitlines()]
        assert len(pairs) == 12 and len({p["rollout"] for p in pairs}) == 4  # least certain, spread over the groups
        judged = [json.loads(x) for x in (cycle / "judge" / "judgments.jsonl").read_text().splitlines()]
        assert len(judged) == 24 and oracle.asked == 24 and all(j["winner"] in ("first", "second") for j in judged)
        assert len((cycle / "filter" / "pairs.jsonl").read_text().splitlines()) == 12  # the oracle is consistent in both orders

        again = dict(config=CONFIG, train=TrainConfig(epochs=1, batch_pairs=4, lora_rank=4), judge_contract=CONTRACT, device="cpu")
        shutil.rmtree(cycle / "export")
        result = run_cycle(recorded, tiny_bundle, cycle, [url], **again)
        assert result.ran == ("export",) and oracle.asked == 24  # nothing before it redone, no judge asked again
        assert result.passed == report["passed"] and (result.export is not None) == report["passed"]
        (cycle / "gate" / "gate.json").unlink()
        (cycle / "gate" / "done.json").unlink()
        result = run_cycle(recorded, tiny_bundle, cycle, [url], **again)
        # the same figures again: export's input is unchanged, so a passed export stands (a failed one is tried again)
        assert result.ran == (("gate",) if report["passed"] else ("gate", "export")) and result.report["checks"]["holdout"] == held

        def failing(*args, **kwargs):  # a gate that fails (the figures stay real): nothing may be exported
            checks = {**report["checks"], "holdout": {**held, "passed": False, "why": "candidate worse"}}
            return {**report, "passed": False, "checks": checks}

        monkeypatch.setattr("nvrm.refresh.gate.run_gate", failing)
        shutil.rmtree(cycle / "gate")
        capsys.readouterr()
        rc = main(refresh_argv(recorded, tiny_bundle, cycle, url))
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and err[-1].startswith("nvrm refresh: gate failed, nothing exported: holdout: candidate worse")
        assert not (cycle / "export" / "bundle").exists() and not (cycle / "export" / "done.json").exists()
        assert json.loads((cycle / "gate" / "gate.json").read_text())["passed"] is False  # the report is written all the same
    finally:
        server.shutdown()


def test_a_cycle_killed_mid_judging_resumes_and_ends_as_an_uninterrupted_one(recorded, tiny_bundle, tmp_path):
    cycle = tmp_path / "cycle"
    oracle = Oracle(recorded, cycle, delay=0.3)
    server, url = serve_oracle(oracle)
    journal = cycle / "judge" / "judgments.jsonl"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "nvrm", *refresh_argv(recorded, tiny_bundle, cycle, url), "--concurrency", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.is_file() and len(journal.read_text().splitlines()) >= 4:
                break
            time.sleep(0.05)
        proc.kill()  # SIGKILL, mid-judging
        proc.wait()
        made = len(journal.read_text().splitlines())
        assert 4 <= made < 24 and not (cycle / "judge" / "done.json").exists()
        oracle.delay = 0.0
        result = run_cycle(recorded, tiny_bundle, cycle, [url], config=CONFIG,
                           train=TrainConfig(epochs=1, batch_pairs=4, lora_rank=4), judge_contract=CONTRACT, device="cpu")
        assert result.ran[0] == "judge"  # the record and the pairs were done: kept
        rows = [json.loads(x) for x in journal.read_text().splitlines()]
        assert len(rows) == 24 and len({(r["pair_id"], r["order"]) for r in rows}) == 24  # nothing judged twice
        if FIGURES:
            assert result.report["checks"]["holdout"] == FIGURES["held"] and result.passed == FIGURES["passed"]
    finally:
        server.shutdown()


def test_a_cycle_killed_at_every_stage_resumes_and_ends_as_an_uninterrupted_one(recorded, tiny_bundle, tmp_path):
    """SIGKILL at the worst moment of every stage (its output written, its done.json not yet): each run dies once, the
    next one goes on from there; the last one ends as the uninterrupted cycle did, with no judge asked twice."""
    from nvrm.refresh.cycle import KILL_AFTER
    from nvrm.refresh.plan import STAGES

    cycle, kills = tmp_path / "cycle", tmp_path / "kills"
    kills.mkdir()
    oracle = Oracle(recorded, cycle)
    server, url = serve_oracle(oracle)
    env = {**os.environ, KILL_AFTER: ",".join(STAGES), KILL_AFTER + "_DIR": str(kills)}
    try:
        died = []
        for _ in range(len(STAGES) + 1):
            proc = subprocess.run([sys.executable, "-m", "nvrm", *refresh_argv(recorded, tiny_bundle, cycle, url)], env=env,
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != -signal.SIGKILL:
                break
            stage = STAGES[len(died)]
            died.append(stage)
            assert (kills / f"{stage}.killed").is_file() and not (cycle / stage / "done.json").exists(), proc.stderr[-2000:]
            assert all((cycle / s / "done.json").is_file() for s in STAGES[: len(died) - 1])
        report = json.loads((cycle / "gate" / "gate.json").read_text())
        assert proc.returncode == (0 if report["passed"] else 1), proc.stderr[-2000:]
        assert died == list(STAGES if report["passed"] else STAGES[:-1])  # a failed gate never reaches export's output
        assert (cycle / "export" / "bundle").is_dir() == report["passed"]
        assert oracle.asked == 24  # the judge stage, killed after its last judgment, asked nothing again
        if FIGURES:
            assert report["checks"] == FIGURES["checks"] and report["passed"] == FIGURES["passed"]
        print(f"killed at {', '.join(died)}; resumed to the gate's verdict {report['passed']}")
    finally:
        server.shutdown()


def test_probe_check_fails_on_a_newly_flagged_probe():
    from nvrm.probe import Outcome
    from nvrm.refresh.gate import probe_check, probe_flags

    class Report:
        def __init__(self, **flags):
            self.outcomes = [Outcome(n, "", 0.0, 1.0 if f else -1.0, 0.5, f) for n, f in flags.items()]

    current = probe_flags([Report(freeze=True, mirror=False), Report(freeze=True, mirror=False)], 0.5)
    same = probe_flags([Report(freeze=True, mirror=False), Report(freeze=False, mirror=True)], 0.5)  # 1 of 2: not over half
    worse = probe_flags([Report(freeze=False, mirror=True), Report(freeze=False, mirror=True)], 0.5)
    assert current["freeze"]["flagged"] and not same["mirror"]["flagged"] and same["mirror"]["flagged_share"] == 0.5
    assert probe_check(current, same, clips=2, failed={})["passed"]
    check = probe_check(current, worse, clips=2, failed={})
    assert not check["passed"] and check["newly_flagged"] == ["mirror"] and "newly flagged for the candidate: mirror" in check["why"]
    assert not probe_check(current, {}, clips=0, failed={"candidate": 2})["passed"]


def test_bad_inputs_are_one_line(tiny_bundle, tmp_path, capsys, monkeypatch):
    argv = ["refresh", "--from", str(tiny_bundle), "--cycle", str(tmp_path / "c"), "--judge", "http://127.0.0.1:9/v1"]
    assert main([*argv, "--record", str(tmp_path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("nvrm: error:")]
    assert len(errors) == 1 and "is not an nvrm record" in errors[0]  # one line, after the progress lines
    assert main([*argv, "--record", str(tmp_path), "--holdout", "1.5"]) == 2
    assert "--holdout 1.5: out of range" in capsys.readouterr().err
    assert main([*argv, "--record", str(tmp_path), "--probe-perturbations", "freeze,wobble"]) == 2
    assert "--probe-perturbations freeze,wobble: unknown wobble" in capsys.readouterr().err
    monkeypatch.delenv("NVRM_ADMIN_KEY", raising=False)
    assert main([*argv, "--record", str(tmp_path), "--serve", "http://127.0.0.1:9"]) == 2
    assert "--admin-key-env NVRM_ADMIN_KEY: the environment variable is not set" in capsys.readouterr().err
