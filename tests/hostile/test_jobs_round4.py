"""Hostile inputs, round 4 (#43 items 6 and 7): the job store's limits hold under concurrency, and an accepted
job's result never turns into a 404."""

from __future__ import annotations

import asyncio
import io
import json
import time

import httpx
import numpy as np
import pytest

from helpers import InProcessServer
from nvrm.protocol import encode_frames
from nvrm.synth.clips import moving_square

VIDEO = np.stack([moving_square(12, 64, 96, seed=40 + i) for i in range(1)])  # [1, T, H, W, 3], 3 s at 4 fps
_FRAMES = moving_square(5, 64, 32, seed=3)
JOB = {"items": [{"prompt": "p", "context": {"frames": encode_frames(_FRAMES[:2]), "fps": 1},
                  "candidate": {"frames": encode_frames(_FRAMES), "fps": 1}}]}
META = {"prompts": ["p"], "media_type": "video", "video_infos": [{"video_fps": 4.0}]}


def enqueue_body() -> bytes:
    buf = io.BytesIO()
    np.save(buf, VIDEO)
    return json.dumps(META).encode() + b"\n" + buf.getvalue()


def concurrently(app, n: int, path: str, **kw) -> list[httpx.Response]:
    """``n`` POSTs to ``path`` at once (one event loop: every body is parsed while the others are admitted)."""

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            return await asyncio.gather(*(c.post(path, **kw) for _ in range(n)))

    return asyncio.run(go())


def test_max_jobs_holds_for_30_concurrent_enqueues(model):
    with InProcessServer(model, max_jobs=8, context_frames=1) as s:
        answers = concurrently(s.app, 30, "/api/reward/enqueue", content=enqueue_body())
        accepted = [r for r in answers if r.status_code == 200]
        refused = [r for r in answers if r.status_code == 503]
        assert len(accepted) <= 8, f"{len(accepted)} of 30 enqueues accepted under --max-jobs 8"
        assert len(accepted) + len(refused) == 30 and all("--max-jobs 8" in r.json()["error"]["message"] for r in refused)


def test_max_jobs_holds_for_concurrent_job_submissions(model):
    with InProcessServer(model, max_jobs=8) as s:
        answers = concurrently(s.app, 20, "/v1/jobs/score", json=JOB)
        assert sum(r.status_code == 200 for r in answers) <= 8, [r.status_code for r in answers]


def test_a_result_bigger_than_the_store_is_never_a_404(model):
    with InProcessServer(model, max_job_results_mb=0.0001, context_frames=1) as s:  # ~100 bytes: no result fits
        r = s.post("/api/reward/enqueue", content=enqueue_body())
        if r.status_code != 200:  # refused at submit: fine, with the reason
            assert "--max-job-results-mb" in r.json()["error"]["message"]
            return
        uid = r.json()["uuid"]
        deadline = time.time() + 60
        while (p := s.post("/api/reward/pull", data={"uuid": uid, "type": "nvrm"})).status_code == 425 and time.time() < deadline:
            time.sleep(0.05)
        assert p.status_code != 404, p.text
        assert p.status_code == 507 and "--max-job-results-mb" in p.json()["error"]["message"], p.text


def test_an_accepted_job_evicted_for_room_answers_507_not_404(model):
    with InProcessServer(model, max_job_results_mb=0.0008) as s:  # room for one result (about 530 bytes, its model and revision tagged)
        ids = [s.post("/v1/jobs/score", json=JOB).json()["id"] for _ in range(3)]
        deadline = time.time() + 60
        answers = {}
        while len(answers) < 3 and time.time() < deadline:
            for i in ids:
                if i not in answers and (r := s.get(f"/v1/jobs/{i}")).status_code != 202:
                    answers[i] = r
            time.sleep(0.05)
        codes = [answers[i].status_code for i in ids]
        assert 404 not in codes, codes
        assert all(c in (200, 507) for c in codes) and 200 in codes, codes


@pytest.mark.parametrize("job_id", ["../../metrics", "..%2F..%2Fmetrics", "0" * 31 + "g", "x" * 4000, "*"])
def test_job_ids_that_are_not_ours_are_404(model, job_id):
    with InProcessServer(model) as s:
        assert s.post("/api/reward/pull", data={"uuid": job_id, "type": "nvrm"}).status_code == 404
