"""Two ``nvrm serve`` processes sharing one real ``redis-server`` (``--job-store redis://``), the layout of one
process per GPU behind a load balancer: any replica answers any job, and none is lost when one dies (kill -9)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from helpers import Server, metric_sum
from nvrm import Clip
from nvrm.synth.clips import moving_square
from redis_server import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
CANDS = [Clip(moving_square(5, 64, 32, seed=10 + i, speed=1 + i), fps=1) for i in range(3)]


@pytest.fixture
def redis(tmp_path):
    with RedisServer(tmp_path / "redis") as r:
        yield r


def replica(bundle, redis, name: str, *extra) -> Server:
    return Server(bundle, "--job-store", redis.url, "--replica-id", name, "--job-lease-s", "2", "--max-wait-ms", "5", *extra)


def test_jobs_are_answered_by_either_replica(tiny_bundle, redis, model):
    a, b = replica(tiny_bundle, redis, "a"), replica(tiny_bundle, redis, "b")
    try:
        from nvrm.client import RewardClient

        ca, cb = RewardClient(a.url), RewardClient(b.url)
        want = [r.reward for r in model.score_group("p", CTX, CANDS)]
        jobs = [(ca, cb)[i % 2].submit_group("p", CTX, CANDS) for i in range(8)]
        for i, job in enumerate(jobs):
            job.client = (cb, ca)[i % 2]  # fetched from the replica it was not sent to
        got = [[r.reward for r in job.result(timeout=120)] for job in jobs]
        assert got == [want] * 8  # 8 of 8
        r = b.get(f"/v1/jobs/{jobs[0].id}")
        assert r.status_code == 200 and r.json()["status"] == "done"
    finally:
        a.stop()
        b.stop()


def test_a_replica_killed_mid_job_loses_none_and_answers_none_twice(tiny_bundle, redis, model):
    from nvrm.client import RewardClient

    a = replica(tiny_bundle, redis, "a", "--job-workers", "16")
    b = None
    try:
        ca = RewardClient(a.url)
        cands = [[Clip(moving_square(5, 64, 32, seed=100 + 3 * j + i, speed=1 + i), fps=1) for i in range(3)] for j in range(16)]
        jobs = [ca.submit_group("p", CTX, c) for c in cands]
        os.kill(a.proc.pid, signal.SIGKILL)  # while it holds the jobs (their leases: 2 s)
        a.proc.wait(10)
        client = redis.client()
        done_before = sum(client.hget(k, "state") == b"done" for k in client.keys("nvrm:*:job:*"))
        b = replica(tiny_bundle, redis, "b")
        cb = RewardClient(b.url)
        for job in jobs:
            job.client = cb
        got = [[r.reward for r in job.result(timeout=180)] for job in jobs]
        want = [[r.reward for r in model.score_group("p", CTX, c)] for c in cands]
        assert got == want, f"{done_before} of 16 were done when replica a died"
        metrics = b.get("/metrics").text
        assert metric_sum(metrics, "nvrm_job_duplicate_results_total") == 0
        assert metric_sum(metrics, "nvrm_jobs_taken_total") == 16 - done_before  # each of the rest scored once, on b
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_ray_serve_replicas_share_the_store(tiny_bundle, redis, model):
    """``nvrm serve --ray --replicas 2 --job-store redis://``: 8 of 8 rollouts and 8 of 8 group jobs, equal to in process."""
    import io
    import json

    import httpx
    import numpy as np

    from helpers import RayServer
    from nvrm.client import RewardClient

    server = RayServer(tiny_bundle, "--replicas", "2", "--cpus-per-replica", "0.5", "--job-store", redis.url)
    try:
        video = np.stack([moving_square(24, 64, 96, seed=40 + i, speed=1 + i) for i in range(8)])
        video[:, 0] = video[0, 0]
        uids, replicas = [], set()
        for v in video:  # cosmos-rl's B = 1 rollouts of one prompt
            buf = io.BytesIO()
            np.save(buf, v[None])
            meta = {"prompts": ["p"], "media_type": "video", "video_infos": [{"video_fps": 4.0}]}
            answer = httpx.post(server.url + "/api/reward/enqueue", content=json.dumps(meta).encode() + b"\n" + buf.getvalue()).json()
            uids.append(answer["uuid"])
            replicas.add(answer["replica_id"])
        rewards = []
        for uid in uids:  # no pinning header: whichever replica the proxy picks answers
            while (r := httpx.post(server.url + "/api/reward/pull", data={"uuid": uid, "type": "nvrm"})).status_code == 425:
                time.sleep(0.1)
            assert r.status_code == 200, r.text
            rewards.append(r.json()["scores"]["reward"][0])
        want = [x.reward for x in model.score_group("p", Clip(video[0, :1], 4.0), [Clip(v[1:], 4.0) for v in video])]
        assert rewards == want and all(rid.startswith("nvrm-") for rid in replicas)
        client = RewardClient(server.url)
        jobs = [client.submit_group("p", CTX, CANDS) for _ in range(8)]
        group = [r.reward for r in model.score_group("p", CTX, CANDS)]
        assert [[r.reward for r in j.result(timeout=120)] for j in jobs] == [group] * 8
    finally:
        server.stop()
