"""The guard through the service: uncertainties and conservative rewards in every answer, refused without a guard, the
per-model monitor (route and metrics) and the protocols that hand out the conservative reward under --conservative."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import InProcessServer, guarded_copy, metric_sum
from nvrm import RewardModel
from nvrm.protocol import encode_frames
from nvrm.prefs.synthetic import PROMPT, make_example

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, tiny_bundle):
    folder = guarded_copy(tiny_bundle, tmp_path_factory.mktemp("guarded") / "tiny")
    m = RewardModel.from_pretrained(folder, device="cpu")
    yield m
    m.close()


def frames(a: np.ndarray, fps: float = 4.0) -> dict:
    return {"frames": encode_frames(a), "fps": fps}


def group_body(ex: dict, names, **extra) -> dict:
    return {"prompt": PROMPT, "context": frames(ex["context"]), "candidates": [frames(ex[n]) for n in names], **extra}


def test_answers_carry_the_uncertainty_and_the_conservative_reward_beside_the_raw_one(guarded):
    ex = make_example(21)
    names = ["preferred", "freeze", "noise"]
    with InProcessServer(guarded) as s:
        plain = s.post("/v1/score_group", json=group_body(ex, names)).json()
        asked = s.post("/v1/score_group", json=group_body(ex, names, conservative=2.0)).json()
        assert s.get("/v1/info").json()["guard"]["threshold"] == guarded.guard.threshold
        client = s.client()
        via_client = client.score_group(PROMPT, _clip(ex["context"]),
                                        [_clip(ex[n]) for n in names])
    assert "conservative" not in plain and all("conservative_reward" not in r for r in plain["results"])
    assert asked["conservative"] == 2.0
    for p, a in zip(plain["results"], asked["results"]):
        assert p["reward"] == a["reward"] and p["uncertainty"] == a["uncertainty"] >= 0
        assert a["conservative_reward"] == pytest.approx(a["reward"] - 2.0 * a["uncertainty"])
    assert [r.uncertainty for r in via_client] == pytest.approx([r["uncertainty"] for r in plain["results"]])
    in_process = guarded.score_group(PROMPT, _clip(ex["context"]), [_clip(ex[n]) for n in names])
    assert [r.reward for r in in_process] == [r["reward"] for r in plain["results"]]


def _clip(a: np.ndarray):
    from nvrm import Clip

    return Clip(a, 4.0)


def test_conservative_on_a_model_without_a_guard_is_a_400_naming_the_fix(model):
    ex = make_example(22)
    with InProcessServer(model) as s:
        r = s.post("/v1/score_group", json=group_body(ex, ["preferred"], conservative=1.0))
        bad = s.post("/v1/score_group", json=group_body(ex, ["preferred"], conservative=-1.0))
        assert s.get("/v1/info").json()["guard"] is None
    assert r.status_code == 400 and "has no guard" in r.json()["error"]["message"] and "nvrm guard fit" in r.json()["error"]["message"]
    assert bad.status_code == 400 and "conservative" in bad.json()["error"]["message"]


def test_the_monitor_turns_suspect_on_doubtful_items_and_its_gauges_follow(guarded):
    rng = np.random.default_rng(3)
    with InProcessServer(guarded, monitor_window=64, monitor_min_items=8) as s:
        for seed in range(30, 33):  # genuine candidates: the monitor stays ok
            ex = make_example(seed)
            assert s.post("/v1/score_group", json=group_body(ex, ["preferred", "reverse", "shift"])).status_code == 200
        genuine = s.get("/v1/models/nvrm/monitor").json()
        for seed in range(40, 44):  # the stand-ins for hacked candidates the fixture's guard was fitted to doubt
            ex = make_example(seed)
            spoilt = {n: np.clip(ex[n].astype(int) + rng.integers(-24, 25, ex[n].shape), 0, 255).astype(np.uint8) for n in ("freeze", "teleport")}
            body = {"prompt": PROMPT, "context": frames(ex["context"]), "candidates": [frames(v) for v in spoilt.values()] * 2}
            assert s.post("/v1/score_group", json=body).status_code == 200
        hacked = s.get("/v1/models/nvrm/monitor").json()
        metrics = s.get("/metrics").text
        unknown = s.get("/v1/models/other/monitor")
    assert genuine["state"] == "ok" and genuine["items"] == 9, genuine["reason"]
    assert hacked["state"] == "suspect" and "doubtful" in hacked["reason"] and "\n" not in hacked["reason"], hacked
    assert hacked["revision"] and set(hacked["frames"]) == {"brightness", "saturation", "contrast", "sharpness", "change"}
    assert metric_sum(metrics, "nvrm_monitor_suspect", model="nvrm") == 1.0
    assert metric_sum(metrics, "nvrm_monitor_items", model="nvrm") == 25
    assert unknown.status_code == 400 and "not served" in unknown.json()["error"]["message"]


def test_protocols_hand_out_the_conservative_reward_under_the_flag(guarded, model, tmp_path):
    from nvrm.errors import ConfigError

    ex = make_example(23)
    body = {"protocol_version": "1", "requests": [{"history": [{"video_b64": _b64_mp4(ex["context"], tmp_path / "c.mp4")},
                                                               {"text": PROMPT, "video_b64": _b64_mp4(ex["noise"], tmp_path / "n.mp4")}],
                                                   "required_rewards": ["nvrm"]}]}
    with InProcessServer(guarded, conservative=1.5) as s:
        got = s.post("/unirl/score", json=body).json()
    out = got["results"][0]["nvrm"]
    assert out["reward"] == pytest.approx(out["raw_reward"] - 1.5 * out["uncertainty"]), got
    with pytest.raises(ConfigError, match="has no guard"):
        InProcessServer(model, conservative=1.0)


def _b64_mp4(a: np.ndarray, path) -> str:
    import base64

    from nvrm.synth.clips import write_video

    write_video(path, a, 4.0, options={"crf": "18"})
    return base64.b64encode(path.read_bytes()).decode()


def test_a_sampled_probe_scores_a_perturbation_of_each_probed_item_and_the_monitor_counts_it(guarded):
    import time

    ex = make_example(24)
    with InProcessServer(guarded, probe_rate=1.0) as s:
        assert s.post("/v1/score_group", json=group_body(ex, ["preferred", "reverse", "shift"])).status_code == 200
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and s.get("/v1/models/nvrm/monitor").json()["probe"]["sampled"] < 3:
            time.sleep(0.2)
        snap = s.get("/v1/models/nvrm/monitor").json()
    assert snap["probe"]["sampled"] == 3 and 0.0 <= snap["probe"]["above_original"] <= 1.0
    assert snap["items"] == 6  # the three items and their three probes, all scored by the model


def test_nvrm_serve_members_answers_with_the_members_uncertainty_and_the_reward_unchanged(tiny_bundle, tmp_path):
    """``nvrm serve --members``: the same rewards as without members, the uncertainty that the in-process model with
    members=True gives (a member that doubts every candidate, so the two differ from the guard's), and the conservative
    reward taken from it. ``nvrm serve --member-rate``: the guard's answers, and the members' doubt in the monitor (route
    and metric) alone."""
    from helpers import Server, doubting_member

    from nvrm.cli.main import main

    assert main(["prefs", "synth", "--out", str(tmp_path / "task"), "--train", "2", "--eval", "0", "--seed", "9"]) == 0
    folder = guarded_copy(tiny_bundle, tmp_path / "tiny")
    doubting_member(folder, tmp_path / "member", tmp_path / "task" / "train_pairs.jsonl")
    ex = make_example(23)
    names = ["preferred", "freeze", "noise"]
    cands = [_clip(ex[n]) for n in names]
    with RewardModel.from_pretrained(folder, device="cpu") as plain, RewardModel.from_pretrained(folder, device="cpu", members=True) as checked:
        alone = plain.score_group(PROMPT, _clip(ex["context"]), cands)
        expected = checked.score_group(PROMPT, _clip(ex["context"]), cands)
    assert all(e.uncertainty > a.uncertainty + 1 for e, a in zip(expected, alone))
    server = Server(folder, "--members", "--device", "cpu")
    try:
        answer = server.post("/v1/score_group", json=group_body(ex, names, conservative=1.0), timeout=120).json()
    finally:
        server.stop()
    got = answer["results"]
    assert [r["reward"] for r in got] == [r.reward for r in alone]
    assert [r["uncertainty"] for r in got] == pytest.approx([r.uncertainty for r in expected], rel=1e-4, abs=1e-4)
    assert [r["conservative_reward"] for r in got] == pytest.approx([r["reward"] - r["uncertainty"] for r in got])
    # --member-rate: the members run for the monitor alone (every call at rate 1); the answers are the guard's
    sampled = Server(folder, "--member-rate", "1", "--device", "cpu")
    try:
        answer = sampled.post("/v1/score_group", json=group_body(ex, names), timeout=120).json()
        snap = sampled.get("/v1/models/nvrm/monitor").json()
        metrics = sampled.get("/metrics").text
    finally:
        sampled.stop()
    assert [(r["reward"], r["uncertainty"]) for r in answer["results"]] == [(r.reward, r.uncertainty) for r in alone]
    threshold = snap["uncertainty"]["threshold"]
    share = sum(e.uncertainty > threshold for e in expected) / len(expected)
    assert snap["members"]["checked"] == 3 and snap["members"]["share_above"] == pytest.approx(share) and share > 0
    assert metric_sum(metrics, "nvrm_monitor_members_doubtful_share", model="nvrm") == pytest.approx(share)
