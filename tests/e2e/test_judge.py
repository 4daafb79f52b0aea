"""``nvrm prefs pairs`` and ``nvrm prefs judge`` against a real judge server: ``transformers serve`` on a
tiny random-weight Qwen3-VL chat model (tests/judge_server.py), and nvrm itself as a judge (issue 31).

The random model answers gibberish: each of its rows must be recorded as unparsed, with the raw text
and no winner. Both orders of every pair are asked, the images arrive at the server (it writes each
one it decodes to its TMPDIR), the concurrency bound holds at the network, and kill -9 followed by
--resume asks exactly what is missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from judge_server import CountingProxy, TransformersServe, build_chat_vlm
from nvrm.cli.main import main
from nvrm.prefs.judge_contract import DEFAULT_RUBRIC, JudgeContract, Rubric
from nvrm.prefs.verdict import parse_verdict

SMALL = ["--max-frames", "2", "--max-context-frames", "1", "--image-height", "64", "--max-tokens", "6"]
IMAGES_PER_REQUEST = 2 + 2 + 1


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    d = tmp_path_factory.mktemp("tfserve")
    server = TransformersServe(build_chat_vlm(d / "vlm"), d).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    from nvrm.synth.clips import moving_square, write_video

    d = tmp_path_factory.mktemp("rollouts")
    rows = []
    for r in range(2):
        write_video(d / f"ctx{r}.mp4", moving_square(48, 96, 128, seed=10 + r), 8)
        names = []
        for c in range(3):
            write_video(d / f"r{r}c{c}.mp4", moving_square(48, 96, 128, seed=20 + 3 * r + c, speed=2 + 2 * c), 8)
            names.append(f"r{r}c{c}.mp4")
        rows.append({"id": f"r{r}", "prompt": f"a square moves, take {r}", "context": f"ctx{r}.mp4", "candidates": names})
    (d / "rollouts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return d


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_pairs_all_and_k_are_deterministic(rollouts, tmp_path):
    assert main(["prefs", "pairs", "--rollouts", str(rollouts / "rollouts.jsonl"), "--output", str(tmp_path / "all.jsonl")]) == 0
    every = read_rows(tmp_path / "all.jsonl")
    assert [p["pair_id"] for p in every] == ["r0:0-1", "r0:0-2", "r0:1-2", "r1:0-1", "r1:0-2", "r1:1-2"]
    assert every[0]["a"].endswith("r0c0.mp4") and every[0]["b"].endswith("r0c1.mp4") and every[0]["context"].endswith("ctx0.mp4")
    drawn = []
    for n in range(2):
        out = tmp_path / f"k{n}.jsonl"
        assert main(["prefs", "pairs", "--rollouts", str(rollouts / "rollouts.jsonl"), "--output", str(out), "--strategy", "k", "--k", "2", "--seed", "5"]) == 0
        drawn.append(out.read_text())
    assert drawn[0] == drawn[1] and len(read_rows(tmp_path / "k0.jsonl")) == 4


def test_pairs_uncertain_are_the_closest_rewards_of_the_group_path(rollouts, tmp_path, tiny_bundle):
    from nvrm import RewardModel

    out = tmp_path / "u.jsonl"
    assert main(["prefs", "pairs", "--rollouts", str(rollouts / "rollouts.jsonl"), "--output", str(out), "--strategy", "uncertain", "--k", "1",
                 "--model", str(tiny_bundle)]) == 0
    chosen = read_rows(out)
    assert len(chosen) == 2
    with RewardModel.from_pretrained(tiny_bundle) as model:
        for r, pair in zip(range(2), chosen):
            rewards = [x.reward for x in model.score_group(f"a square moves, take {r}", rollouts / f"ctx{r}.mp4",
                                                           [rollouts / f"r{r}c{c}.mp4" for c in range(3)])]
            gaps = {(i, j): abs(rewards[i] - rewards[j]) for i, j in ((0, 1), (0, 2), (1, 2))}
            i, j = min(gaps, key=lambda k: (gaps[k], k))
            assert pair["pair_id"] == f"r{r}:{i}-{j}" and pair["rewards"] == [rewards[i], rewards[j]]


def judge_cmd(pairs: Path, out: Path, *judges: str, extra=()) -> list[str]:
    return ["prefs", "judge", "--pairs", str(pairs), "--output", str(out), *[a for j in judges for a in ("--judge", j)], *SMALL, *extra]


def test_both_orders_of_every_pair_reach_the_real_server_and_gibberish_is_unparsed(serve, rollouts, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    assert main(["prefs", "pairs", "--rollouts", str(rollouts / "rollouts.jsonl"), "--output", str(pairs)]) == 0
    proxy = CountingProxy(serve.port)
    before = serve.images_received()
    out = tmp_path / "judgments.jsonl"
    capsys.readouterr()
    try:
        assert main(judge_cmd(pairs, out, f"name=tiny,url={proxy.url},model=tiny-vlm", extra=["--concurrency", "2", "--json"])) == 0
    finally:
        proxy.close()
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = read_rows(out)
    assert sorted((r["pair_id"], r["order"]) for r in rows) == sorted((p, o) for p in [x["pair_id"] for x in read_rows(pairs)] for o in ("ab", "ba"))
    assert serve.images_received() - before == len(rows) * IMAGES_PER_REQUEST  # every image of every request arrived
    assert proxy.total >= 1 and 1 <= proxy.most <= 2 and 1 <= summary["max_in_flight"]["tiny"] <= 2
    assert not serve.failures(), serve.failures()  # its model loaded once, by the judge's first request alone
    by = {(r["pair_id"], r["order"]): r for r in rows}
    for (pid, order), r in by.items():
        other = by[(pid, "ba" if order == "ab" else "ab")]
        assert (r["first"], r["second"]) == (other["second"], other["first"])  # the two presentation orders
        assert r["judge"] == "tiny" and r["judge_model"] == "tiny-vlm" and r["error"] is None and r["raw"]
        assert r["template_sha256"] == Rubric(DEFAULT_RUBRIC, "default").sha256
        assert r["judge_contract"] == JudgeContract(max_frames=2, max_context_frames=1, height=64).fingerprint
        verdict = parse_verdict(r["raw"])
        assert r["winner"] == verdict.winner  # never a guessed winner: only what the raw answer says
        if verdict.winner is None:
            assert r["unparsed"]
    assert summary["unparsed"] == sum(r["winner"] is None for r in rows) >= 1
    assert summary["tokens"]["answers_without_usage"] == len(rows)  # transformers serve reports no usage


def test_kill_9_then_resume_asks_exactly_what_is_missing(serve, rollouts, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    assert main(["prefs", "pairs", "--rollouts", str(rollouts / "rollouts.jsonl"), "--output", str(pairs)]) == 0
    out = tmp_path / "judgments.jsonl"
    cmd = [sys.executable, "-m", "nvrm", *judge_cmd(pairs, out, serve.url, extra=["--concurrency", "1", "--max-tokens", "24"])]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 3):
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    kept = read_rows(out) if out.read_bytes().endswith(b"\n") else [json.loads(x) for x in out.read_text().splitlines()[:-1]]
    assert 3 <= len(kept) < 12, len(kept)
    images_at_kill = serve.images_received()
    assert subprocess.run(cmd, capture_output=True).returncode == 2  # an existing output needs --resume
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = read_rows(out)
    keys = [(r["pair_id"], r["order"], r["judge"]) for r in rows]
    assert len(keys) == len(set(keys)) == 12  # nothing lost, nothing twice
    assert rows[: len(kept)] == kept  # what was journaled before the kill stays as it was
    assert serve.images_received() - images_at_kill == (12 - len(kept)) * IMAGES_PER_REQUEST  # nothing journaled was asked again


def test_a_reward_model_judges_through_the_same_format_and_agrees_with_itself(serve, rollouts, tmp_path, tiny_bundle, capsys):
    pairs = tmp_path / "pairs.jsonl"
    assert main(["prefs", "pairs", "--rollouts", str(rollouts / "rollouts.jsonl"), "--output", str(pairs)]) == 0
    out = tmp_path / "two.jsonl"
    capsys.readouterr()
    assert main(judge_cmd(pairs, out, f"nvrm:{tiny_bundle}", f"name=tiny,url={serve.url}", extra=["--json"])) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = read_rows(out)
    mine = [r for r in rows if r["judge"] == f"nvrm:{tiny_bundle.name}"]
    assert len(mine) == 12 and all(r["winner"] in ("first", "second", "tie") and 0.5 <= r["confidence"] <= 1 for r in mine)
    for r in mine:
        raw = json.loads(r["raw"])
        assert r["winner"] == ("first" if raw["reward_first"] > raw["reward_second"] else "second" if raw["reward_second"] > raw["reward_first"] else "tie")
    per = summary["agreement"]["per_judge"]
    assert per[f"nvrm:{tiny_bundle.name}"] == {"pairs_both_orders": 6, "order_consistency": 1.0}
    assert f"nvrm:{tiny_bundle.name}|tiny" in summary["agreement"]["cross_judge"] or f"tiny|nvrm:{tiny_bundle.name}" in summary["agreement"]["cross_judge"]
    kept = tmp_path / "kept.jsonl"
    removed = tmp_path / "removed.jsonl"
    assert main(["prefs", "filter", "--input", str(out), "--output", str(kept), "--removed", str(removed)]) == 0
    reasons = [json.loads(x)["reason"] for x in removed.read_text().splitlines()]
    assert reasons.count("unjudged") == sum(r["winner"] is None for r in rows) >= 1
    assert len(read_rows(kept)) + reasons.count("cycle") + reasons.count("judges_disagree") >= 1
    assert main(["prefs", "filter", "--input", str(out), "--output", str(kept), "--removed", str(removed), "--require-judges", "2"]) == 0
    both = {pid for pid in {r["pair_id"] for r in rows}
            if all(any(x["pair_id"] == pid and x["judge"] == j and x["order"] == o and x["winner"] for x in rows)
                   for j in ("tiny", mine[0]["judge"]) for o in ("ab", "ba"))}
    pair_of = {frozenset((r["first"], r["second"])): r["pair_id"] for r in rows}
    assert {pair_of[frozenset((k["chosen"], k["rejected"]))] for k in read_rows(kept)} <= both
    reasons = [json.loads(x)["reason"] for x in removed.read_text().splitlines()]
    assert reasons.count("too_few_judges") >= 6 - len(both) - reasons.count("judges_disagree") - reasons.count("inconsistent") >= 1
