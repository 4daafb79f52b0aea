"""cosmos-rl 0.4.7's own client code, unchanged, against ``nvrm serve --ray --replicas 2 --job-store redis://``: every
rollout comes back (8 of 8, legacy ``RemoteReward`` and ``RemoteRewardCalculator``) with the in-process rewards, though
its pulls land on either replica (Ray Serve's proxy ignores the pinning header)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import RayServer
from redis_server import RedisServer
from test_cosmos_env import HERE, _expected, cosmos_site, vae  # noqa: F401 - the fixtures, shared
from overlays import env_with

pytestmark = [pytest.mark.trainers, pytest.mark.slow, pytest.mark.exclusive]


def test_cosmos_rl_client_code_gets_every_reward_from_two_ray_replicas(cosmos_site, vae, demo, tmp_path):  # noqa: F811
    from nvrm.serve.protocols.cosmos.latents import LatentDecoder

    model = demo[0]
    with RedisServer(tmp_path / "redis") as redis:
        server = RayServer(model.path, "--replicas", "2", "--cpus-per-replica", "0.5", "--latent-decoder", vae, "--job-store", redis.url,
                           "--api-key-env", "NVRM_COSMOS_KEY", env={"NVRM_COSMOS_KEY": "s3cret"})
        try:
            out = tmp_path / "out"
            proc = subprocess.run([sys.executable, str(HERE / "cosmos_callsite.py"), server.url, "s3cret", str(vae), str(out)],
                                  capture_output=True, text=True, env=env_with(cosmos_site), timeout=900)
            assert "COSMOS_OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:] + server.output()
        finally:
            server.stop()
    result = json.loads((out / "result.json").read_text())
    decoder = LatentDecoder(vae, "cpu")
    assert [r[0] for r in result["legacy"]] == _expected(model, decoder, np.load(out / "legacy.npy"), 1)  # 8 of 8, bit for bit
    assert result["calculator"] == _expected(model, decoder, np.load(out / "calculator.npy"), 3)
