"""Asynchronous jobs (``/v1/jobs``, ``RewardClient.submit``) and cosmos-rl's enqueue/pull protocol, with the
app in process: bounded queues that refuse with a reason, results kept for their TTL, every failure named."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest

from helpers import InProcessServer
from nvrm import Clip
from nvrm.client import RemoteItemError, ServiceError
from nvrm.synth.clips import moving_square

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
CANDS = [Clip(moving_square(5, 64, 32, seed=10 + i, speed=1 + i), fps=1) for i in range(3)]
SHORT = Clip(moving_square(2, 64, 32, seed=9), fps=1)


@pytest.fixture(scope="module")
def served(model):
    s = InProcessServer(model, max_wait_ms=10)
    yield s
    s.stop()


def test_submitted_jobs_give_what_the_synchronous_calls_give(served, model):
    import asyncio

    client = served.client()
    job = client.submit([("p", CTX, c) for c in CANDS] + [("p", CTX, SHORT)])
    group = client.submit_group("p", CTX, CANDS)
    got = job.result(timeout=60)
    want = [r.reward for r in model.score_batch([("p", CTX, c) for c in CANDS])]
    assert [r.reward for r in got[:3]] == want and isinstance(got[3], RemoteItemError) and got[3].code == "contract_violation"
    assert [r.reward for r in group.result(timeout=60)] == [r.reward for r in model.score_group("p", CTX, CANDS)]
    assert job.done() and served.get(f"/v1/jobs/{job.id}").json()["status"] == "done"  # fetched again: still there

    async def go():
        j = await client.asubmit([("p", CTX, CANDS[0])])
        return await j.aresult(timeout=60)

    assert asyncio.run(go())[0].reward == want[0]
    r = served.get("/v1/jobs/0123456789abcdef")
    assert r.status_code == 404 and r.json()["error"]["code"] == "job_unknown"


def test_a_full_job_store_refuses_and_results_expire(model):
    with InProcessServer(model, max_jobs=1, job_ttl_s=0.5) as s:
        client = s.client(retries=0)
        first = client.submit([("p", CTX, CANDS[0])])
        first.result(timeout=60)
        with pytest.raises(ServiceError, match="job store is full"):  # the finished job still holds its place
            client.submit([("p", CTX, CANDS[1])])
        time.sleep(0.7)
        assert s.get(f"/v1/jobs/{first.id}").status_code == 404  # expired: unknown from now on
        client.submit([("p", CTX, CANDS[1])]).result(timeout=60)  # and its place is free again


# ---------------------------------------------------------------- cosmos-rl's protocol


def enqueue_body(meta: dict, array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return json.dumps(meta).encode() + b"\n" + buf.getvalue()


def pull(s, uid: str, kind: str = "nvrm", timeout: float = 60):
    deadline = time.time() + timeout
    while True:
        r = s.post("/api/reward/pull", data={"uuid": uid, "type": kind})
        if r.status_code != 425 or time.time() > deadline:
            return r
        assert r.headers["retry-after"] == "1"
        time.sleep(0.05)


VIDEO = np.stack([moving_square(24, 64, 96, seed=40 + i, speed=1 + i) for i in range(3)])  # [3, T, H, W, 3], 6 s at 4 fps
VIDEO[:, 0] = VIDEO[0, 0]  # one conditioning frame


def test_pixel_rollouts_score_like_score_group_with_the_leading_frames_as_context(served, model):
    meta = {"prompts": ["A square glides."] * 3, "reward_fn": {"nvrm": 1.0}, "video_infos": [{"video_fps": 4.0}] * 3, "media_type": "video"}
    r = served.post("/api/reward/enqueue", content=enqueue_body(meta, VIDEO), headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200 and set(r.json()) == {"uuid"}
    answer = pull(served, r.json()["uuid"]).json()
    want = [x.reward for x in model.score_group("A square glides.", Clip(VIDEO[0, :1], 4.0), [Clip(v[1:], 4.0) for v in VIDEO])]
    assert answer["scores"]["reward"] == answer["scores"]["overall_reward"] == want
    assert answer["errors"] == [] and answer["type"] == "nvrm" and answer["input_info"]["context_frames"] == 1
    assert answer["decoded_duration"] == "N/A" and float(answer["duration"]) > 0
    channels_first = served.post("/api/reward/enqueue", content=enqueue_body(meta, np.ascontiguousarray(VIDEO.transpose(0, 4, 1, 2, 3))))
    assert pull(served, channels_first.json()["uuid"]).json()["scores"]["reward"] == want  # [B, 3, T, H, W] is the same video


def test_failed_rollouts_get_the_fallback_and_are_named(model):
    with InProcessServer(model, context_frames=0, cosmos_fallback_score=-3.5) as s:
        meta = {"prompts": ["p", "p"], "media_type": "video", "video_infos": [{"video_fps": 4.0}] * 2}
        r = s.post("/api/reward/enqueue", content=enqueue_body(meta, VIDEO[:2]))
        answer = pull(s, r.json()["uuid"]).json()
        assert answer["scores"]["reward"] == [-3.5, -3.5] and answer["failed"] == [0, 1]  # never a silent 0
        assert all("no_context" in e["error"] for e in answer["errors"])  # text-to-world needs the opt-in


@pytest.mark.parametrize("meta,array,status,said", [
    ({"prompts": ["p"]}, np.zeros((1, 16, 3, 4, 4), np.float32), 400, "no latent decoder"),
    ({"prompts": ["p"], "reward_fn": {"dance_grpo": 1.0}, "media_type": "video"}, VIDEO[:1], 400, "computes nvrm"),
    ({"prompts": ["p", "q"], "media_type": "video"}, VIDEO[:1], 400, "1 videos for 2 prompts"),
    ({"prompts": "p", "media_type": "video"}, VIDEO[:1], 400, "non-empty list of strings"),
    ({"prompts": ["p"], "media_type": "video"}, VIDEO[:1].astype(np.float32), 400, "must be uint8"),
    ({"prompts": ["p"], "media_type": "image"}, VIDEO[:1], 400, "'latent'"),
    ({"prompts": ["p"], "media_type": "video", "video_infos": [{"video_fps": 0}]}, VIDEO[:1], 400, "video_fps"),
])
def test_malformed_enqueue_bodies_are_refused_before_decoding(served, meta, array, status, said):
    r = served.post("/api/reward/enqueue", content=enqueue_body(meta, array))
    assert r.status_code == status and said in r.json()["error"]["message"], r.text


def test_pull_answers_425_404_and_refuses_another_reward(served):
    meta = {"prompts": ["p"], "media_type": "video", "video_infos": [{"video_fps": 4.0}]}
    uid = served.post("/api/reward/enqueue", content=enqueue_body(meta, VIDEO[:1])).json()["uuid"]
    first = served.post("/api/reward/pull", data={"uuid": uid, "type": "nvrm"})
    assert first.status_code in (200, 425)
    assert pull(served, uid, "dance_grpo").status_code == 400
    assert pull(served, uid).status_code == 200
    assert served.post("/api/reward/pull", data={"uuid": "nope", "type": "nvrm"}).status_code == 404
    assert served.get("/api/reward/ping").json()["status"] == "ok"


def test_api_routes_need_the_token_and_memory_admission_counts_decoded_frames(model, tmp_path):
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = tmp_path / "vae"
    AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[], temperal_downsample=[False, True, True]
    ).save_pretrained(str(vae))
    with InProcessServer(model, api_key="k", latent_decoder=str(vae), max_inflight_mb=128) as s:
        body = enqueue_body({"prompts": ["p"]}, np.zeros((1, 16, 24, 8, 12), np.float32))
        assert s.post("/api/reward/enqueue", content=body).status_code == 401
        assert s.post("/api/reward/pull", data={"uuid": "x"}).status_code == 401
        auth = {"Authorization": "Bearer k"}
        big = enqueue_body({"prompts": ["p"]}, np.zeros((1, 16, 24, 60, 80), np.float32))  # 93 frames of 480x640: ~400 MB decoded
        r = s.post("/api/reward/enqueue", content=big, headers=auth)
        assert r.status_code == 413 and "--max-inflight-mb" in r.json()["error"]["message"]
        r = s.post("/api/reward/enqueue", content=body, headers=auth)
        assert r.status_code == 200
        deadline = time.time() + 60
        while True:
            p = s.post("/api/reward/pull", data={"uuid": r.json()["uuid"], "type": "nvrm"}, headers=auth)
            if p.status_code != 425 or time.time() > deadline:
                break
            time.sleep(0.05)
        answer = p.json()
        assert p.status_code == 200 and len(answer["scores"]["reward"]) == 1 and float(answer["decoded_duration"]) > 0
        assert answer["input_info"]["shape"] == [1, 16, 24, 8, 12] and answer["input_info"]["media_type"] == "latent"
