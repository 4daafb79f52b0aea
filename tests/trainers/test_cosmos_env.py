"""cosmos-rl 0.4.7's own client code, unchanged, gets NVRM rewards from ``nvrm serve`` (part of ``make test``).

cosmos-rl is installed with ``--no-deps`` (its wheel would bring vLLM, NCCL and another torch) into an
overlay on this environment, with the few packages its client modules import (``tests/overlays.py``:
about 25 MB, a few seconds). The server runs the demo bundle with a tiny random Wan2.1 VAE
(diffusers ``AutoencoderKLWan``, ``save_pretrained``) as its latent decoder. The rewards must equal
in-process ``score_group`` on the same decoded frames, bit for bit (after cosmos-rl's own clip to
[-5, 5]).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import Server, metric_sum
from overlays import env_with, overlay

pytestmark = pytest.mark.trainers

HERE = Path(__file__).resolve().parent
PROMPT = "A square glides across a tiled floor."
COSMOS = ["cosmos-rl==0.4.7", "nvidia-ml-py==13.615.71", "math-verify==0.9.0", "latex2sympy2_extended==1.11.0", "antlr4-python3-runtime==4.13.2",
          "einops==0.8.2",
          # cosmos-rl's Wan2.1 decoder module imports its storage and media helpers at import time
          "boto3==1.44.8", "botocore==1.44.8", "s3transfer==0.19.3", "jmespath==1.1.0", "python-dateutil==2.9.0.post0", "imageio==2.38.2", "trimesh==5.2.0"]


@pytest.fixture(scope="module")
def cosmos_site():
    return overlay(COSMOS, "cosmos-rl-0.4.7", no_deps=True)


@pytest.fixture(scope="module")
def vae(tmp_path_factory):
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("wan") / "tiny-wan2.1-vae"
    AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[], temperal_downsample=[False, True, True]
    ).save_pretrained(str(folder))
    return folder


def _counter(server, name: str, **labels) -> float:
    return metric_sum(server.get("/metrics", headers={"Authorization": "Bearer s3cret"}).text, name, **labels)


def _expected(model, decoder, latents: np.ndarray, per_request: int, clip: bool = True):
    """In-process scores of the frames the server decodes (requests of ``per_request`` videos), clipped as cosmos-rl does."""
    from nvrm import Clip

    # one call: a rollout decodes to the same frames alone or in any batch (nvrm.serve.protocols.cosmos.latents), however the server batched them
    frames = decoder.decode(latents)[0]
    assert all(np.array_equal(f[:1], frames[0][:1]) for f in frames)  # one conditioning frame: one context
    results = model.score_group(PROMPT, Clip(frames[0][:1], 16.0), [Clip(f[1:], 16.0) for f in frames])
    return [min(5.0, max(-5.0, r.reward)) if clip else r.reward for r in results]


def test_cosmos_rl_client_code_gets_nvrm_rewards(cosmos_site, vae, demo, tmp_path):
    from nvrm.serve.protocols.cosmos.latents import LatentDecoder

    model = demo[0]
    server = Server(model.path, "--latent-decoder", vae, "--api-key-env", "NVRM_COSMOS_KEY", env={"NVRM_COSMOS_KEY": "s3cret"})
    try:
        out = tmp_path / "out"
        proc = subprocess.run([sys.executable, str(HERE / "cosmos_callsite.py"), server.url, "s3cret", str(vae), str(out)],
                              capture_output=True, text=True, env=env_with(cosmos_site), timeout=900)
        assert "COSMOS_OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:] + server.output()
        result = json.loads((out / "result.json").read_text())
        not_ready = _counter(server, "nvrm_requests_total", endpoint="/api/reward/pull", code="425")
        prefix_hits = _counter(server, "nvrm_prefix_cache_total", result="hit")
        shared = _counter(server, "nvrm_shared_context_items_total")
    finally:
        server.stop()
    assert result["cosmos_rl"] == "0.4.7" and result["retry_helper"] == "make_request_with_retry"
    decoder = LatentDecoder(vae, "cpu")
    legacy = np.load(out / "legacy.npy")
    assert [r[0] for r in result["legacy"]] == _expected(model, decoder, legacy, 1)  # 8 B=1 requests, bit for bit
    assert result["calculator"] == _expected(model, decoder, np.load(out / "calculator.npy"), 3)  # one request of 3
    assert not_ready > 0  # a pull before the rewards were ready got 425, and the client retried through it
    # the group's 8 requests shared the context's prefill: in one group (their latents decode in one batch and reach the
    # scheduler together, nvrm.serve.protocols.cosmos.latents.DecodeQueue), or from the kept prefix when one arrives later
    assert shared + prefix_hits >= 7
    assert "401" in result["wrong_token"]  # no token, no rewards: raised at once, not retried
    assert result["decoder_max_abs_diff"] <= 1e-6  # cosmos-rl's Wan2.1 decoder and diffusers' agree


def test_a_pickled_or_malformed_body_is_refused_before_decoding(vae, demo):
    import io

    import httpx

    server = Server(demo[0].path, "--latent-decoder", vae)
    try:
        def post(body: bytes):
            return httpx.post(server.url + "/api/reward/enqueue", content=body, headers={"content-type": "application/octet-stream"}, timeout=30)

        head = json.dumps({"prompts": [PROMPT], "reward_fn": {"nvrm": 1.0}}).encode() + b"\n"
        pickled = io.BytesIO()
        np.save(pickled, np.array([{"os": "system"}], dtype=object), allow_pickle=True)
        r = post(head + pickled.getvalue())
        assert r.status_code == 400 and "float32 or float16" in r.json()["error"]["message"], r.text
        latents = io.BytesIO()
        np.save(latents, np.zeros((1, 16, 3, 4, 4), np.float32))
        assert post(head + latents.getvalue()[:-8]).status_code == 400  # a shape that disagrees with its bytes
        assert post(b"{not json\n" + latents.getvalue()).status_code == 400
        assert post(head + latents.getvalue()).status_code == 200
        assert _counter(server, "nvrm_requests_total", endpoint="/api/reward/enqueue", code="400") == 3
    finally:
        server.stop()


def test_cosmos_rl_reward_fn_naming_two_served_models_gets_both_score_sets(cosmos_site, vae, demo, tmp_path):
    """Issue 39, item 2: ``nvrm serve --model nvrm=DEMO --model mine=OTHER``; cosmos-rl 0.4.7's ``RemoteRewardCalculator``
    with ``reward_fns`` nvrm (weight 1.0) and mine (0.5) pulls each name's raw scores (each model's in-process
    ``score_group``, bit for bit) and combines them itself (``clip(score) * weight`` summed, then its total clip)."""
    import torch

    from nvrm import RewardModel
    from nvrm.serve.protocols.cosmos.latents import LatentDecoder
    from nvrm.synth.bundles import ArchSpec, build_tiny_bundle

    other = build_tiny_bundle(tmp_path / "mine", ArchSpec(seed=7))
    server = Server(f"nvrm={demo[0].path}", "--model", f"mine={other}", "--latent-decoder", vae, "--api-key-env", "NVRM_COSMOS_KEY",
                    env={"NVRM_COSMOS_KEY": "s3cret"})
    try:
        out = tmp_path / "out"
        fns = {"nvrm": 1.0, "mine": 0.5}
        proc = subprocess.run([sys.executable, str(HERE / "cosmos_callsite.py"), server.url, "s3cret", str(vae), str(out), json.dumps(fns)],
                              capture_output=True, text=True, env=env_with(cosmos_site), timeout=900)
        assert "COSMOS_OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:] + server.output()
    finally:
        server.stop()
    result = json.loads((out / "result.json").read_text())
    decoder = LatentDecoder(vae, "cpu")
    latents = np.load(out / "calculator.npy")
    with RewardModel.from_pretrained(other, device="cpu") as mine:
        raw = {"nvrm": _expected(demo[0], decoder, latents, 3, clip=False), "mine": _expected(mine, decoder, latents, 3, clip=False)}
    assert result["types"] == raw and raw["nvrm"] != raw["mine"]  # both score sets, each its model's own
    total = 0
    for name, weight in fns.items():  # cosmos-rl's fetch_reward, as it combines the pulled scores
        lo, hi, w = result["clips"][name]
        assert w == weight
        total += torch.clamp(torch.tensor(raw[name]), min=lo, max=hi) * w
    lo, hi, scale = result["total_clip"]
    assert result["calculator"] == (torch.clamp(total, min=lo, max=hi) * scale).tolist()
