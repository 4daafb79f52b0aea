"""nvrm serve --ray: the same app as Ray Serve replicas, on a local Ray cluster with CPU replicas."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import ray.serve  # noqa: F401 - installed by the test extra: these tests run in CI, never skipped
from helpers import GROUP_ULPS, bf16_ulp
from nvrm import Clip
from nvrm.client import RewardClient
from nvrm.synth.clips import moving_square

NVRM = Path(sys.executable).parent / "nvrm"
CTX = Clip(moving_square(8, 64, 80, seed=1), fps=4)
CANDS = [Clip(moving_square(20, 64, 80, seed=10 + i, speed=1 + i), fps=4) for i in range(3)]


@pytest.fixture(scope="module")
def ray_server(tiny_bundle, tmp_path_factory):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path_factory.mktemp("rayserve") / "serve.log", "w+")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [str(NVRM), "serve", "--model", str(tiny_bundle), "--ray", "--replicas", "2", "--cpus-per-replica", "0.5",
         "--port", str(port), "--api-key-env", "NVRM_KEY"],
        stdout=log, stderr=subprocess.STDOUT, env={**env, "NVRM_KEY": "k"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while time.time() < deadline:
        assert proc.poll() is None, _tail(log)
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    else:
        proc.kill()
        raise AssertionError("ray serve did not become ready: " + _tail(log))
    yield url, proc, log
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.close()


def _tail(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-3000:]


def test_replicas_answer_like_the_model_and_share_the_load(ray_server, model):
    url, _, _ = ray_server
    client = RewardClient(url, api_key="k")
    want = [model.score("p", CTX, c).reward for c in CANDS]
    bodies = []

    def hit() -> None:
        r = httpx.post(url + "/v1/score_group", timeout=120, headers={"Authorization": "Bearer k"}, **client._group("p", CTX, CANDS, False))
        bodies.append((r.status_code, r.json()))

    for _ in range(3):  # concurrent requests, so the router has a reason to use both replicas
        threads = [threading.Thread(target=hit) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    replicas = set()
    for status, body in bodies:
        assert status == 200, body
        assert all(abs(x["reward"] - w) <= GROUP_ULPS * bf16_ulp(w) for x, w in zip(body["results"], want))
        replicas.add(body["replica"])  # a group is one request: one replica scored all of it
    assert len(bodies) == 24 and len(replicas) == 2, replicas  # Ray Serve routed between the two replicas


def test_auth_and_limits_hold_on_every_replica(ray_server):
    url, _, _ = ray_server
    assert httpx.get(url + "/healthz").status_code == 200
    assert httpx.get(url + "/v1/info").status_code == 401
    info = httpx.get(url + "/v1/info", headers={"Authorization": "Bearer k"}).json()
    assert info["limits"]["auth"] is True and info["limits"]["max_request_items"] == 256
    bad = httpx.post(url + "/v1/score", content=b"{oops", headers={"Authorization": "Bearer k", "content-type": "application/json"}, timeout=60)
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]


def test_sigterm_stops_the_deployment(ray_server):
    url, proc, log = ray_server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    assert "nvrm serve: stopped" in _tail(log)
