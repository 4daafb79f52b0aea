"""The differentiable reward: the forward value is the contract's reward bit for bit, and the gradient
is the surrogate's, checked against finite differences, through checkpointing, and end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nvrm import Clip, RewardModel
from nvrm.scoring.differentiable import quantize
from nvrm.errors import InputError
from nvrm.synth.clips import moving_square

CTX = Clip(moving_square(3, 64, 96, seed=1), fps=1)


def videos(b: int, t: int = 12, h: int = 64, w: int = 96, seed: int = 5) -> torch.Tensor:
    """[B, T, C, H, W] float in [0, 1], the layout a video generator decodes to."""
    frames = np.stack([moving_square(t, h, w, seed=seed + i, speed=1 + i) for i in range(b)])
    return torch.from_numpy(frames).permute(0, 1, 4, 2, 3).float() / 255


def scored(model, x: torch.Tensor, fps: float) -> list[float]:
    """``score`` on the quantised frames, candidate by candidate."""
    u8 = quantize(x).permute(0, 1, 3, 4, 2).numpy()
    return [model.score("p", CTX, Clip(u8[b], fps=fps)).reward for b in range(len(u8))]


@pytest.mark.slow
def test_the_forward_value_is_score_bit_for_bit(model):
    x = videos(3, t=11, h=70, w=90) * 1.1 - 0.05  # values outside [0, 1] are clamped, as the adapters do
    rewards = model.differentiable()("p", CTX, x.requires_grad_(), fps=2)
    assert rewards.shape == (3,) and rewards.requires_grad
    assert rewards.tolist() == scored(model, x, 2)
    one = model.differentiable()("p", CTX, x[0].detach().permute(0, 2, 3, 1), fps=2)  # [T, H, W, 3]
    assert one.tolist() == scored(model, x[:1], 2)


@pytest.mark.slow
def test_at_the_release_depth_too(deep_bundle):
    with RewardModel.from_pretrained(deep_bundle, device="cpu") as deep:
        x = videos(2, t=6, h=48, w=64)
        assert deep.differentiable()("p", CTX, x, fps=1).tolist() == scored(deep, x, 1)


def test_gradients_reach_the_sampled_frames_only_and_the_weights_not_at_all(model):
    weights = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    x = videos(2, t=12).requires_grad_()
    model.differentiable()("p", CTX, x, fps=2).sum().backward()
    per_frame = x.grad.abs().sum(dim=(2, 3, 4))  # [B, T]
    sampled = [0, 2, 4, 6, 8]  # 1 FPS ticks of a 2 fps clip
    assert torch.isfinite(x.grad).all()
    assert (per_frame[:, sampled] > 0).all()
    assert (per_frame[:, [k for k in range(12) if k not in sampled]] == 0).all()
    assert all(p.grad is None and not p.requires_grad for p in model.backbone.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in model.backbone.state_dict().items())


@pytest.mark.slow
def test_checkpointing_changes_memory_not_gradients(model):
    grads = []
    for on in (True, False):
        x = videos(2, t=6).requires_grad_()
        model.differentiable(checkpointing=on)("p", CTX, x, fps=1).sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


def test_pixel_value_gradients_match_central_differences_in_float32(model32):
    """The differentiable part (pixel values -> reward), along random directions."""
    scorer = model32.differentiable(checkpointing=False)
    x = videos(1, t=5)
    _, prepared, _ = scorer.prepare_candidates(x, 1)
    enc = model32.engine.encode_group("p", model32.prepare_video(CTX, "context"), prepared)
    base = model32.engine.codec.to_pixel_values(enc.candidate_pixels[0])
    pv = base.clone().requires_grad_()
    scorer.rewards_of(enc, [pv])[0].backward()
    g = pv.grad / pv.grad.norm()
    gen = torch.Generator().manual_seed(0)
    # the reward of a random tiny model barely moves along a random direction (below float32's
    # resolution), so each direction mixes the gradient's with a random one
    for mix in (0.0, 0.5, 1.0):
        r = torch.randn(base.shape, generator=gen)
        v = g + mix * r / r.norm()
        v /= v.norm()
        eps = 0.1
        with torch.no_grad():
            up = scorer.rewards_of(enc, [base + eps * v])[0]
            down = scorer.rewards_of(enc, [base - eps * v])[0]
        fd = float((up - down) / (2 * eps))
        ad = float((pv.grad * v).sum())
        assert abs(ad - fd) <= 1e-3 * max(abs(fd), 1e-6), (ad, fd)


@pytest.mark.slow
def test_gradient_ascent_raises_the_frozen_candidates_exact_reward(demo):
    """End to end on the demo model: the surrogate's gradient, applied to the frames and re-quantised,
    raises the reward ``score`` gives (which is also how reward hacking starts)."""
    from nvrm.cli.demo import DEMO_PROMPT
    from nvrm.video.decode import decode_frames

    model, ctx, cands = demo
    frames, fps = decode_frames(cands["frozen"])
    before = model.score(DEMO_PROMPT, ctx, cands["frozen"]).reward
    scorer = model.differentiable()
    x = torch.from_numpy(frames).float() / 255
    first = None
    for _ in range(20):
        x = x.detach().requires_grad_()
        reward = scorer(DEMO_PROMPT, ctx, x, fps=fps)[0]
        first = float(reward.detach()) if first is None else first
        reward.backward()
        x = (x + 2 / 255 * x.grad.sign()).clamp(0, 1)
    assert first == before  # the decoded frames score as the file does
    after = model.score(DEMO_PROMPT, ctx, Clip(quantize(x).numpy(), fps=fps)).reward
    assert after > before, (before, after)


@pytest.mark.parametrize("frames, fps, message", [
    (torch.zeros(2, 8, 8), 1, r"shape \(2, 8, 8\); pass \[T, H, W, 3\] or \[B, T, C=3, H, W\]"),
    (torch.zeros(1, 5, 8, 8, 3), 1, r"shape \(1, 5, 8, 8, 3\)"),
    (torch.zeros(5, 8, 8, 3, dtype=torch.uint8), 1, r"are uint8; pass float values in \[0, 1\]"),
    (torch.full((5, 8, 8, 3), float("nan")), 1, "NaN"),
    (torch.zeros(3, 32, 32, 3), 1, r"3\.00 s; the contract needs 5\.00 s"),
    (torch.zeros(5, 32, 32, 3), 0, "fps 0"),
])
def test_bad_frames_are_one_line_errors(model, frames, fps, message):
    with pytest.raises(InputError, match=message) as e:
        model.differentiable()("p", CTX, frames, fps=fps)
    assert "\n" not in str(e.value)


def test_the_plain_api_detaches_frames_that_require_grad(model):
    from nvrm.rl import flow_grpo_reward

    x = videos(2, t=5).requires_grad_()
    scores, info = flow_grpo_reward(model)("cpu")(x, ["p"] * 2, [{"context_video": CTX, "fps": 1}] * 2)
    assert info["nvrm_failed"] == [] and scores == scored(model, x, 1) and x.grad is None


@pytest.mark.slow
def test_refl_reward_groups_items_and_keeps_the_graph(model):
    from nvrm.rl import refl_reward
    from nvrm.errors import ConfigError, RewardFnError

    other = Clip(moving_square(4, 64, 96, seed=9), fps=1)
    x = videos(4, t=10).requires_grad_()
    fn = refl_reward(model, fps=2)
    rewards = fn(x, ["p", "q", "p", "q"], [CTX, other, CTX, other])
    assert rewards.shape == (4,) and rewards.requires_grad
    pairs = [("p", CTX), ("q", other), ("p", CTX), ("q", other)]
    want = [model.score(p, c, Clip(quantize(x[i]).permute(0, 2, 3, 1).numpy(), fps=2)).reward for i, (p, c) in enumerate(pairs)]
    assert rewards.tolist() == want
    (-rewards.mean()).backward()  # a ReFL loss
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    with pytest.raises(RewardFnError, match=r"2 of 2 item\(s\) failed.*5\.00 s"):
        fn(videos(2, t=4), ["p", "p"], [CTX, CTX])
    with pytest.raises(ConfigError, match="gradients do not cross the network"):
        refl_reward("http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="context 1 is None"):
        fn(videos(2, t=10), ["p", "p"], [CTX, None])
