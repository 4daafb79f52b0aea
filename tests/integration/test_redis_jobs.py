"""The Redis job store (``--job-store redis://``) against a real ``redis-server``, with the app in process:
any replica answers any job, the limits hold across replicas, and Redis' faults are 503s with the reason."""

from __future__ import annotations

import asyncio
import io
import json
import time

import httpx
import numpy as np
import pytest

from helpers import InProcessServer, free_port
from nvrm import Clip
from nvrm.protocol import encode_frames
from nvrm.synth.clips import moving_square
from redis_server import RedisServer, require_redis

FRAMES = moving_square(5, 64, 32, seed=3)
CTX = Clip(FRAMES[:2], fps=1)
CANDS = [Clip(moving_square(5, 64, 32, seed=10 + i, speed=1 + i), fps=1) for i in range(3)]
JOB = {"items": [{"prompt": "p", "context": {"frames": encode_frames(FRAMES[:2]), "fps": 1},
                  "candidate": {"frames": encode_frames(FRAMES), "fps": 1}}]}
VIDEO = np.stack([moving_square(24, 64, 96, seed=40 + i, speed=1 + i) for i in range(2)])
VIDEO[:, 0] = VIDEO[0, 0]
META = {"prompts": ["p", "p"], "media_type": "video", "video_infos": [{"video_fps": 4.0}] * 2}


def enqueue_body(meta=META, array=VIDEO) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return json.dumps(meta).encode() + b"\n" + buf.getvalue()


def wait(call, pending=(202, 425), timeout=60):
    deadline = time.time() + timeout
    while (r := call()).status_code in pending and time.time() < deadline:
        time.sleep(0.05)
    return r


@pytest.fixture
def redis(tmp_path):
    with RedisServer(tmp_path / "redis") as r:
        yield r


@pytest.fixture(scope="module")
def model2(tiny_bundle):
    """A second copy of the tiny model: the other replica scores on its own."""
    from nvrm import RewardModel

    m = RewardModel.from_pretrained(tiny_bundle, device="cpu")
    yield m
    m.close()


def test_a_job_submitted_on_one_replica_is_fetched_on_the_other(redis, model, model2):
    with InProcessServer(model, job_store=redis.url, replica_id="a") as a, \
            InProcessServer(model2, job_store=redis.url, replica_id="b") as b:
        job = a.client().submit_group("p", CTX, CANDS)
        r = wait(lambda: b.get(f"/v1/jobs/{job.id}"))
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        want = [x.reward for x in model.score_group("p", CTX, CANDS)]
        assert [x["reward"] for x in r.json()["results"]] == want
        assert [x.reward for x in job.result(timeout=60)] == want  # and from the replica it was sent to
        uid = a.post("/api/reward/enqueue", content=enqueue_body())
        assert uid.status_code == 200 and uid.json()["replica_id"] == "a"  # cosmos-rl pins its pulls to it (not needed here)
        answer = wait(lambda: b.post("/api/reward/pull", data={"uuid": uid.json()["uuid"], "type": "nvrm"}))
        frames = [Clip(v[1:], 4.0) for v in VIDEO]
        assert answer.json()["scores"]["reward"] == [x.reward for x in model.score_group("p", Clip(VIDEO[0, :1], 4.0), frames)]
        assert b.get("/api/reward/ping").json()["jobs"] == 2


def test_max_jobs_holds_across_replicas_under_concurrency(redis, model, model2):
    with InProcessServer(model, job_store=redis.url, max_jobs=8) as a, InProcessServer(model2, job_store=redis.url, max_jobs=8) as b:

        async def go():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(a.app), base_url="http://a") as ca, \
                    httpx.AsyncClient(transport=httpx.ASGITransport(b.app), base_url="http://b") as cb:
                body = enqueue_body()
                return await asyncio.gather(*((ca if i % 2 else cb).post("/api/reward/enqueue", content=body) for i in range(30)))

        answers = asyncio.run(go())
        assert sum(r.status_code == 200 for r in answers) == 8, [r.status_code for r in answers]
        assert all("--max-jobs 8" in r.json()["error"]["message"] for r in answers if r.status_code != 200)


def test_a_result_too_big_to_keep_answers_507_and_foreign_ids_build_no_key(redis, model):
    with InProcessServer(model, job_store=redis.url, max_job_results_mb=0.0001) as s:
        jid = s.post("/v1/jobs/score", json=JOB).json()["id"]
        r = wait(lambda: s.get(f"/v1/jobs/{jid}"))
        assert r.status_code == 507 and "--max-job-results-mb" in r.json()["error"]["message"], r.text
        keys_before = set(redis.client().keys("*"))
        for bad in ("../../metrics", "*", "0" * 31 + "g", jid.upper(), "x" * 3000, "nvrm:*"):
            assert s.post("/api/reward/pull", data={"uuid": bad, "type": "nvrm"}).status_code == 404
        assert s.get("/v1/jobs/..%2F..%2Fmetrics").status_code == 404
        assert set(redis.client().keys("*")) == keys_before


def test_redis_lost_is_a_503_with_retry_after_and_it_recovers(redis, model):
    with InProcessServer(model, job_store=redis.url) as s:
        jid = s.post("/v1/jobs/score", json=JOB).json()["id"]
        assert wait(lambda: s.get(f"/v1/jobs/{jid}")).status_code == 200
        redis.stop()
        for r in (s.post("/v1/jobs/score", json=JOB), s.get(f"/v1/jobs/{jid}"), s.post("/api/reward/enqueue", content=enqueue_body()),
                  s.post("/api/reward/pull", data={"uuid": jid}), s.get("/api/reward/ping")):
            assert r.status_code == 503 and r.json()["error"]["code"] == "job_store_unavailable" and r.headers["retry-after"], r.text
        redis.start()  # empty: persistence is off, so the old job is gone (the client's retry re-enqueues)
        assert s.get(f"/v1/jobs/{jid}").status_code == 404
        jid = s.post("/v1/jobs/score", json=JOB).json()["id"]
        assert wait(lambda: s.get(f"/v1/jobs/{jid}")).json()["status"] == "done"


def test_redis_full_is_a_503_naming_maxmemory(tmp_path, model):
    with RedisServer(tmp_path / "r", "--maxmemory", "3mb", "--maxmemory-policy", "noeviction") as redis, \
            InProcessServer(model, job_store=redis.url, max_body_mb=8) as s:
        meta = {**META, "prompts": ["p"] * 8, "video_infos": [{"video_fps": 4.0}] * 8}
        big = enqueue_body(meta, np.zeros((8, 12, 128, 160, 3), np.uint8))
        r = s.post("/api/reward/enqueue", content=big)
        assert r.status_code == 503 and r.json()["error"]["code"] == "job_store_full", r.text
        assert "maxmemory" in r.json()["error"]["message"] and r.headers["retry-after"]


def test_an_unreachable_redis_at_start_is_one_line_naming_the_url(model, capsys):
    from nvrm.cli.main import main

    require_redis()
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert main(["serve", "--model", "demo", "--job-store", url, "--port", str(free_port())]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and url in err[0] and "unreachable" in err[0], err


def test_the_first_result_wins_and_an_expired_lease_goes_back_to_the_queue(redis):
    from nvrm.serve.jobs.redis_store import RedisJobStore

    store = RedisJobStore(redis.url, "t", max_jobs=4, ttl_s=60, max_result_bytes=10_000, lease_s=0.3, admit_grace_s=60)
    store.bind("rev")
    jid = "ab" * 16
    assert store.admit(jid) is None and store.enqueue(jid, "v1:score", "", {}, b"{}", "application/json")
    first = store.take("dead", 4)
    assert [t.id for t in first] == [jid] and store.take("other", 4) == []  # leased: nobody else gets it
    time.sleep(0.4)  # "dead" never renews
    assert [t.id for t in store.take("other", 4)] == [jid]
    assert store.finish(jid, {"status": "done", "by": "other"}) == 1
    assert store.finish(jid, {"status": "done", "by": "dead"}) == 0  # a late duplicate: dropped
    assert store.get(jid)["result"] == {"status": "done", "by": "other"}


def test_one_prompts_rollouts_are_taken_together(redis):
    from nvrm.serve.jobs.redis_store import RedisJobStore

    store = RedisJobStore(redis.url, "t", max_jobs=16, ttl_s=60, max_result_bytes=10_000, lease_s=30, admit_grace_s=60)
    store.bind("rev")
    ids = [f"{i:032x}" for i in range(6)]
    for i, jid in enumerate(ids):
        assert store.admit(jid) is None and store.enqueue(jid, "cosmos", "ga" if i % 2 == 0 else "gb", {}, b"x", "")
    assert [t.id for t in store.take("w", 8)] == ids[0::2]  # group ga, whole
    assert [t.id for t in store.take("w", 2)] == ids[1::2][:2]  # at most 2

