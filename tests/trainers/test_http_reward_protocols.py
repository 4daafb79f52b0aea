"""UniRL's and verl-omni's HTTP reward protocols on ``nvrm serve``, driven by those trainers' own client code (issue 41).

- UniRL 0.2.0 (``unirl.reward.remote.RemoteRewardBackend``), from the registry into an overlay of its own
  (``--no-deps --ignore-requires-python``: it declares Python >= 3.12, its client runs on 3.11), with
  imageio and imageio-ffmpeg, which its video encoder (diffusers' ``export_to_video``) needs.
- verl-omni @ a1139baf's safetensors scorer client (``vendored/verl_omni_latent_scorer_client.py``).

Rewards equal in-process ``RewardModel.score`` on the same frames (the mp4 bytes UniRL sent; the frames
verl-omni sent) bit for bit, a group shares one prefill, a bad item fails alone, a pickle gets 415.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import Server, metric_sum
from overlays import env_with, overlay

pytestmark = [pytest.mark.trainers, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
PROMPT = "A square glides across a tiled floor."
UNIRL = ["unirl==0.2.0", "imageio==2.38.1", "imageio-ffmpeg==0.8.1"]
PICKLE_LIKE = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x06images\x94]\x94u."
"""The first bytes of ``pickle.dumps({"images": []})`` (protocol 4), written out: nothing here pickles."""


@pytest.fixture(scope="module")
def unirl_site():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_IGNORE_REQUIRES_PYTHON", "1")  # unirl declares Python >= 3.12; its client code runs on 3.11
        return overlay(UNIRL, "unirl-0.2.0", no_deps=True)


@pytest.fixture(scope="module")
def served(demo, tmp_path_factory):
    model, ctx, _ = demo
    outside = tmp_path_factory.mktemp("outside") / "context.mp4"
    outside.write_bytes(Path(ctx).read_bytes())
    server = Server(model.path, "--allow-dir", Path(ctx).parent)
    yield server, model, ctx, outside
    server.stop()


def _metric(server, name: str, **labels) -> float:
    return metric_sum(server.get("/metrics").text, name, **labels)


def test_unirl_client_gets_nvrm_rewards(unirl_site, served, tmp_path):
    server, model, ctx, _ = served
    shared0 = _metric(server, "nvrm_shared_context_items_total")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(HERE / "unirl_callsite.py"), server.url + "/unirl", str(ctx), str(out)],
                          capture_output=True, text=True, env=env_with(unirl_site), timeout=600)
    assert "UNIRL_OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:] + server.output()
    result = json.loads((out / "result.json").read_text())
    assert result["available"] and result["posts"] == 1
    expected = [model.score(PROMPT, ctx, (out / f"video{i}.mp4").read_bytes()).reward for i in range(4)]
    assert result["rewards"][:4] == expected and len(set(expected)) == 4  # distinct, bit for bit
    assert result["component"]["nvrm"][:4] == expected
    # the sample with no context fails alone, by UniRL's convention: reward 0.0, success False, its reason
    assert result["successes"] == [True] * 4 + [False] and result["rewards"][4] == 0.0
    assert "no context video" in result["errors"][4] and "nvrm_context" in result["errors"][4]
    assert _metric(server, "nvrm_shared_context_items_total") - shared0 >= 3  # the group of 4 shared one prefill


def test_unirl_route_refuses_a_path_outside_allow_dir_and_a_pickle(served):
    server, _, ctx, outside = served
    req = {"history": [{"text": PROMPT, "video_path": str(ctx)}], "required_rewards": ["nvrm"],
           "metadata": {"nvrm_context": {"path": str(outside)}}}
    r = server.post("/unirl/score", json={"protocol_version": "1", "requests": [req]}, timeout=60)
    assert r.status_code == 403 and "outside the allowed directories" in r.json()["errors"][0]["nvrm"], r.text
    r = server.post("/unirl/score", content=PICKLE_LIKE, headers={"content-type": "application/octet-stream"}, timeout=60)
    assert r.status_code == 415 and "safetensors" in r.json()["error"]["message"], r.text
    health = server.get("/unirl/health").json()
    assert health["status"] == "ok" and "nvrm" in health["rewards"]


def _frames(seed: int, n: int, speed: float = 1.0):
    from nvrm.synth.clips import moving_square

    return moving_square(n, 64, 96, seed=seed, speed=speed)


def _payload(frames: np.ndarray, **meta: str) -> bytes:
    import torch
    from safetensors.torch import save

    tensors = {"frames": torch.from_numpy(np.ascontiguousarray(frames[None]))}
    if "context" in meta:
        tensors["context"] = torch.from_numpy(np.ascontiguousarray(meta.pop("context")[None]))
    return save(tensors, metadata={"prompt": PROMPT, "fps": "4", **meta})


def test_verl_omni_safetensors_client_gets_nvrm_rewards(served):
    from vendored import verl_omni_latent_scorer_client as client

    from nvrm import Clip

    server, model, ctx, _ = served
    url = server.url + "/drm/score"
    context = _frames(7, 8)
    # rewards far apart under the demo model
    candidates = [_frames(seed, 20, speed) for seed, speed in ((43, 4), (44, 1), (47, 0), (40, 0))]
    shared0 = _metric(server, "nvrm_shared_context_items_total")

    async def group():  # verl-omni's RewardLoopWorker gathers one request per sample
        try:
            frames = [client._request_score(url, _payload(c, context=context), 60.0) for c in candidates]
            by_path = client._request_score(url, _payload(candidates[0], context_path=str(ctx)), 60.0)
            return await asyncio.gather(*frames), await by_path
        finally:
            await client.compute_score._session.close()

    raw, raw_by_path = asyncio.run(group())
    expected = [model.score(PROMPT, Clip(context, 4.0), Clip(c, 4.0)).reward for c in candidates]
    assert raw == expected and len(set(expected)) == 4  # distinct, bit for bit
    assert raw_by_path == model.score(PROMPT, ctx, Clip(candidates[0], 4.0)).reward
    assert _metric(server, "nvrm_shared_context_items_total") - shared0 >= 1  # requests of one context joined one prefill


def test_verl_omni_sd35_body_and_pickle_are_refused_clearly(served):
    import httpx
    import torch

    from vendored import verl_omni_latent_scorer_client as client

    server = served[0]
    url = server.url + "/drm/score"
    inputs = {"solution_image": torch.zeros(16, 2, 2), "ground_truth": "",
              "extra_info": {"prompt_embeds": torch.zeros(4, 8), "pooled_prompt_embeds": torch.zeros(8)}}

    async def sd35():
        try:
            return await client.compute_score(**inputs, server_url=url, max_retries=0)
        finally:
            await client.compute_score._session.close()

    with pytest.raises(RuntimeError, match="HTTP 400.*SD3.5 image latents.*send 'frames'"):
        asyncio.run(sd35())
    r = httpx.post(url, content=PICKLE_LIKE, headers={"content-type": "application/octet-stream"}, timeout=30)
    assert r.status_code == 415 and "safetensors protocol" in r.json()["error"]["message"], r.text
    r = httpx.post(url, content=_payload(_frames(1, 20)), headers={client.PROTOCOL_HEADER: "1"}, timeout=30)
    assert r.status_code == 400 and "no context video" in r.json()["error"]["message"], r.text


# ---------------------------------------------------------------- cosmos-rl's other media on /api/reward/enqueue


def _enqueue(server, meta: dict, array: np.ndarray):
    """A cosmos-rl enqueue body (``json + b"\\n" + np.save(array)``, as 0.4.7's ``cosmos_rl/reward/remote_calculator.py``
    writes it), pulled."""
    import io
    import time

    buf = io.BytesIO()
    np.save(buf, array)
    body = json.dumps(meta).encode() + b"\n" + buf.getvalue()
    r = server.post("/api/reward/enqueue", content=body, headers={"content-type": "application/octet-stream"})
    if r.status_code != 200:
        return r
    deadline = time.time() + 120
    while True:
        pulled = server.post("/api/reward/pull", data={"uuid": r.json()["uuid"], "type": "nvrm"})
        if pulled.status_code != 425 or time.time() > deadline:
            return pulled
        time.sleep(0.05)


IMAGES = np.stack([_frames(43, 1, 0)[0], _frames(47, 1, 0)[0]])  # cosmos-rl's image rollouts: uint8 [B, H, W, 3]
IMAGE_META = {"prompts": [PROMPT] * 2, "reward_fn": {"nvrm": 1.0}, "media_type": "image"}


def test_cosmos_image_rollouts_are_refused_unless_opted_in_and_then_flagged(demo):
    from helpers import InProcessServer
    from nvrm import Clip

    model = demo[0]
    with InProcessServer(model) as s:
        r = _enqueue(s, IMAGE_META, IMAGES)
        assert r.status_code == 400 and "a still image is not a 5 s continuation" in r.json()["error"]["message"], r.text
    with InProcessServer(model, cosmos_image_as="still") as s:
        answer = _enqueue(s, IMAGE_META, IMAGES).json()
    held = 1 + 5 * 16  # one context frame, then 5 s at cosmos-rl's default 16 FPS
    want = [model.score(PROMPT, Clip(im[None], 16.0), Clip(np.repeat(im[None], held - 1, 0), 16.0)).reward for im in IMAGES]
    assert answer["scores"]["reward"] == want and answer["errors"] == []
    assert "still videos" in answer["flagged"] and answer["input_info"]["media_type"] == "image"


@pytest.fixture(scope="module")
def wan22_vae(tmp_path_factory):
    """A tiny random Wan2.2-layout VAE (48 latent channels, 16x spatial, patch size 2), saved as diffusers does."""
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("wan22") / "tiny-wan2.2-vae"
    AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                     temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12, patch_size=2,
                     scale_factor_spatial=16, latents_mean=[0.0] * 48, latents_std=[1.0] * 48).save_pretrained(str(folder))
    return folder


def test_cosmos_48_channel_latents_decode_with_a_wan22_vae_and_are_refused_without(demo, wan22_vae):
    from diffusers import AutoencoderKLWan

    from helpers import InProcessServer
    from nvrm import Clip
    from nvrm.serve.protocols.cosmos.latents import LatentDecoder

    model = demo[0]
    latents = np.random.default_rng(0).standard_normal((2, 48, 4, 4, 6)).astype(np.float32)  # -> 13 frames of 64 x 96
    meta = {"prompts": [PROMPT] * 2, "reward_fn": {"nvrm": 1.0}, "video_infos": [{"video_fps": 2.0}] * 2, "media_type": "latent"}
    with InProcessServer(model, latent_decoder=str(wan22_vae)) as s:
        answer = _enqueue(s, meta, latents).json()
    frames = LatentDecoder(wan22_vae, "cpu").decode(latents)[0]
    assert frames.shape == (2, 13, 64, 96, 3)
    want = [model.score(PROMPT, Clip(f[:1], 2.0), Clip(f[1:], 2.0)).reward for f in frames]
    assert answer["scores"]["reward"] == want and answer["errors"] == [], answer
    with InProcessServer(model) as s:
        r = _enqueue(s, meta, latents)
        assert r.status_code == 400 and "48-channel latents" in r.json()["error"]["message"], r.text
    wan21 = wan22_vae.parent / "tiny-wan2.1-vae"
    AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                     temperal_downsample=[False, True, True]).save_pretrained(str(wan21))
    with InProcessServer(model, latent_decoder=str(wan21)) as s:
        r = _enqueue(s, meta, latents)
        assert r.status_code == 400 and "start it with a Wan2.2 VAE" in r.json()["error"]["message"], r.text
