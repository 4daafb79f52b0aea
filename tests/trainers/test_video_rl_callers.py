"""nvrm's rewards at three video-RL trainers' own reward call paths, on the shipped demo model (issue 41).

The trainers are repositories, not packages; their call paths are vendored under ``vendored/`` at
pinned commits (source, commit and license at the top of each file):

- DanceGRPO @ 15cc71d5 (``train_grpo_hunyuan.py``): one ``inferencer.reward([path], [caption])`` per
  video, ``VQ`` / ``MQ`` read, any exception turned into -1, per-group advantages;
- FastVideo main @ f1e0bb4a (``BaseRewardModel``) with the aggregator @ 44f0124e: ``compute_reward``
  through ``MultiRewardAggregator`` (an ``nn.ModuleList``, batch z-score);
- verl-omni @ a1139baf: ``VisualRewardManager.run_single`` and ``MultiVisualRewardManager`` (per-sample
  calls from executor threads, a failed optional entry counted as 0.0).

Each checks: distinct rewards equal ``RewardModel.score`` on the same frames bit for bit; a group the
trainer hands at once is one ``score_groups`` group (one prefill); a failed item follows the trainer's
own convention.
"""

from __future__ import annotations

import asyncio
import importlib

import numpy as np
import pytest
import torch

from nvrm import Clip
from nvrm.errors import ConfigError, RewardFnError
from nvrm.rl import FastVideoReward, VideoAlignReward, verl_omni_compute_score
from nvrm.synth.clips import moving_square, write_video
from vendored import dancegrpo_hunyuan, fastvideo_rl_rewards, verl_omni_reward_managers

PROMPT = "A square glides across a tiled floor at constant speed."


def spy_groups(monkeypatch, model) -> list[int]:
    """The size of every group ``model.score_groups`` is handed (one group: one shared prefill)."""
    sizes: list[int] = []
    real = model.score_groups

    def spy(groups, **kw):
        return real([g for g in groups if sizes.append(len(g[2])) or True], **kw)

    monkeypatch.setattr(model, "score_groups", spy)
    return sizes


KINDS = ("smooth", "frozen", "reversed", "teleport")


def rollouts(cands, n, first=None):
    """(uint8 [B, T, H, W, 3], fps): the demo's continuations as decoded rollouts (``first``: a shared leading frame)."""
    from nvrm.video.decode import decode_frames

    decoded = [decode_frames(cands[k]) for k in KINDS[:n]]
    vids = np.stack([frames for frames, _ in decoded])
    if first is not None:
        vids = np.concatenate([np.broadcast_to(first, (n, 1, *first.shape)), vids], axis=1)
    return np.ascontiguousarray(vids), decoded[0][1]


def as_float_btchw(vids: np.ndarray) -> torch.Tensor:
    """[B, T, C, H, W] float in [0, 1], as a decoder hands them."""
    return torch.from_numpy(vids).permute(0, 1, 4, 2, 3).float() / 255


# ---------------------------------------------------------------- VideoAlign-shaped (DanceGRPO)


def test_dancegrpo_reads_vq_and_mq_from_the_mapping_and_keeps_minus_one_for_a_failure(demo, tmp_path):
    model, ctx, cands = demo
    paths = [str(cands[k]) for k in ("smooth", "frozen", "reversed", "teleport")]
    inferencer = VideoAlignReward(model, keys=("VQ", "MQ"), context=str(ctx))
    vq, mq = dancegrpo_hunyuan.videoalign_rewards(inferencer, paths + [str(tmp_path / "missing.mp4")], [[PROMPT]] * 5)
    want = torch.tensor([model.score(PROMPT, ctx, p).reward for p in paths])
    assert len(set(want.tolist())) == 4
    assert torch.equal(vq[:4], want) and torch.equal(mq[:4], want)  # each key carries the same NVRM reward
    assert vq[4].item() == -1.0 and mq[4].item() == -1.0  # nvrm raised; DanceGRPO's own except gave -1
    samples, total = dancegrpo_hunyuan.advantages({"vq_rewards": vq[:4], "mq_rewards": mq[:4]}, 4, vq_coef=0.5, mq_coef=0.5)
    assert torch.allclose(total, samples["vq_advantages"])  # with coefficients summing to 1: one reward's advantage


def test_videoalign_puts_nvrm_under_overall_only_unless_mapped(demo):
    model, ctx, cands = demo
    inferencer = VideoAlignReward(model, context=str(ctx))
    [out] = inferencer.reward([str(cands["smooth"])], [PROMPT], use_norm=True)
    want = model.score(PROMPT, ctx, cands["smooth"])
    # the demo bundle has a guard: beside the reward, the raw reward and its uncertainty (never a VideoAlign dimension)
    assert out == {"Overall": want.reward, "nvrm_raw_reward": want.reward, "nvrm_uncertainty": pytest.approx(want.uncertainty, rel=1e-3)}
    vq, _ = dancegrpo_hunyuan.videoalign_rewards(inferencer, [str(cands["smooth"])], [[PROMPT]])
    assert vq.tolist() == [-1.0]  # no 'VQ' without keys=: DanceGRPO's except, never another model's name
    with pytest.raises(ConfigError, match="keys=.*VQ, MQ, TA"):
        VideoAlignReward(model, keys=("Overall",), context=str(ctx))


def test_videoalign_list_call_is_one_group_with_one_prefill(demo, monkeypatch):
    model, ctx, cands = demo
    paths = [str(cands[k]) for k in ("smooth", "frozen", "reversed")]
    inferencer = VideoAlignReward(model, context=str(ctx))
    sizes = spy_groups(monkeypatch, model)
    got = [r["Overall"] for r in inferencer.reward(paths, [PROMPT] * 3)]
    assert sizes == [3]
    assert got == [model.score(PROMPT, ctx, p).reward for p in paths]


def test_videoalign_sampling_arguments_follow_the_contract(demo):
    model, ctx, cands = demo
    inferencer = VideoAlignReward(model, context=str(ctx))
    c = model.contract
    assert inferencer.reward([str(cands["smooth"])], [PROMPT], fps=c.sample_fps, max_pixels=c.max_pixels)[0]["Overall"] is not None
    assert inferencer.reward([str(cands["smooth"])], [PROMPT], num_frames=round(c.candidate_seconds * c.sample_fps))
    refused = (({"fps": 2.0}, "fps=2.0: nvrm's contract"), ({"num_frames": 16}, "num_frames=16"),
               ({"max_pixels": 230400}, "max_pixels=230400"))
    for kw, text in refused:
        with pytest.raises(ConfigError, match=text) as e:
            inferencer.reward([str(cands["smooth"])], [PROMPT], **kw)
        assert "\n" not in str(e.value)


def test_videoalign_context_per_prompt_and_from_leading_frames(demo, tmp_path):
    model, ctx, cands = demo
    other = "A second prompt with no context given."
    inferencer = VideoAlignReward(model, context={PROMPT: str(ctx)})
    with pytest.raises(RewardFnError, match=r"\[1\].*no context \(context\[prompt\]") as e:
        inferencer.reward([str(cands["smooth"])] * 2, [PROMPT, other])
    assert list(e.value.failures) == [1]
    # an image-to-video rollout: its first frame is the image it was generated from (an image context)
    path = write_video(tmp_path / "i2v.mp4", moving_square(48, 96, 128, seed=5), 8)
    from nvrm.video.decode import decode_frames

    frames, fps = decode_frames(path)
    [got] = VideoAlignReward(model, context_frames=1).reward([str(path)], [PROMPT])
    assert got["Overall"] == model.score(PROMPT, frames[0], Clip(frames[1:], fps)).reward
    with pytest.raises(RewardFnError, match=r"context\(prompt\) raised ZeroDivisionError"):
        VideoAlignReward(model, context=lambda prompt: 1 / 0).reward([str(cands["smooth"])], [PROMPT])
    with pytest.raises(ConfigError, match="context and context_frames both given"):
        VideoAlignReward(model, context=str(ctx), context_frames=1)
    with pytest.raises(ConfigError, match="no context source"):
        VideoAlignReward(model)


# ---------------------------------------------------------------- FastVideo


def test_fastvideo_aggregator_path_is_bit_exact_and_one_group(demo, monkeypatch):
    model, ctx, cands = demo
    vids, fps = rollouts(cands, 4)
    nvrm_reward = FastVideoReward(model, fps=fps, context=str(ctx))
    aggregator = fastvideo_rl_rewards.MultiRewardAggregator([nvrm_reward], [1.0], normalize_rewards=True)  # create_reward_models' form
    sizes = spy_groups(monkeypatch, model)
    videos = as_float_btchw(vids)
    raw = nvrm_reward.compute_reward(videos, [PROMPT] * 4)
    assert sizes == [4]
    want = torch.tensor([model.score(PROMPT, ctx, Clip(v, fps)).reward for v in vids], dtype=torch.float32)
    assert len(set(want.tolist())) == 4 and torch.equal(raw, want)
    aggregated = aggregator.compute_reward(videos, [PROMPT] * 4)
    assert torch.equal(aggregated, (want - want.mean()) / (want.std() + 1e-8))
    # the pipeline's comments say [B, C, T, H, W]: the same rewards
    assert torch.equal(nvrm_reward.compute_reward(videos.permute(0, 2, 1, 3, 4), [PROMPT] * 4), want)


def test_fastvideo_failed_video_stops_the_step_or_gets_its_group_mean(demo):
    model, ctx, cands = demo
    vids, fps = rollouts(cands, 3)
    videos = as_float_btchw(vids)
    videos[2, 0, 0, 0, 0] = float("nan")
    aggregator = fastvideo_rl_rewards.MultiRewardAggregator([FastVideoReward(model, fps=fps, context=str(ctx))], [1.0])
    with pytest.raises(RewardFnError, match=r"\[2\] video 2: contains NaN"):
        aggregator.compute_reward(videos, [PROMPT] * 3)  # FastVideo has no failure convention: the step stops
    filled = FastVideoReward(model, fps=fps, context=str(ctx), on_error="group_mean")
    raw = filled.compute_reward(videos, [PROMPT] * 3)
    assert raw[2].item() == pytest.approx((raw[0].item() + raw[1].item()) / 2) and list(filled.last_errors) == [2]
    assert torch.isfinite(fastvideo_rl_rewards.MultiRewardAggregator([filled], [1.0]).compute_reward(videos, [PROMPT] * 3)).all()


def test_fastvideo_leading_frame_is_an_image_context_shared_by_the_group(demo, monkeypatch):
    model, _, cands = demo
    plain, _ = rollouts(cands, 1)
    first = plain[0, 0] // 2 + 60
    vids, fps = rollouts(cands, 3, first=first)  # an image-to-video policy: every rollout starts at its image
    reward = FastVideoReward(model, fps=fps, context_frames=1)
    sizes = spy_groups(monkeypatch, model)
    got = reward.compute_reward(as_float_btchw(vids), [PROMPT] * 3)
    assert sizes == [3]  # equal leading frames: one context, one prefill
    want = torch.tensor([model.score(PROMPT, first, Clip(v[1:], fps)).reward for v in vids], dtype=torch.float32)
    assert len(set(want.tolist())) == 3 and torch.equal(got, want)
    broken = as_float_btchw(vids[:1])
    broken[0, 5, 0, 0, 0] = float("nan")
    with pytest.raises(RewardFnError, match=r"\[0\] video 0: contains NaN"):  # its own reason, not "no context"
        reward.compute_reward(broken, [PROMPT])
    meta = FastVideoReward(model, fps=fps, context_key="context_video")
    with pytest.raises(RewardFnError, match=r"no context \(metadata\[i\]\['context_video'\]"):
        meta.compute_reward(as_float_btchw(vids[:1]), [PROMPT])


# ---------------------------------------------------------------- verl-omni


def omni_samples(ctx, vids):
    """(data_source, solution_image [T, C, H, W] uint8, ground_truth = the prompt, extra_info) per rollout."""
    return [("nvrm_video", torch.from_numpy(v).permute(0, 3, 1, 2).contiguous(), PROMPT, {"context_video": str(ctx), "index": i})
            for i, v in enumerate(vids)]


async def gather_visual(fn, samples, output_type="np"):
    loop = asyncio.get_running_loop()
    return await asyncio.gather(*(verl_omni_reward_managers.visual_run_single(fn, loop, *s, output_type=output_type) for s in samples))


def test_verl_omni_visual_manager_per_sample_calls_are_one_group(demo, monkeypatch):
    model, ctx, cands = demo
    vids, fps = rollouts(cands, 4)
    fn = verl_omni_compute_score(model, context_key="context_video", fps=fps, coalesce_ms=200)
    sizes = spy_groups(monkeypatch, model)
    outs = asyncio.run(gather_visual(fn, omni_samples(ctx, vids)))
    assert sizes == [4]  # four per-sample calls from verl-omni's executor threads: one batch, one prefill
    want = [model.score(PROMPT, ctx, Clip(v, fps)).reward for v in vids]
    assert len(set(want)) == 4 and [o["reward_score"] for o in outs] == want
    extra = dict(outs[0]["reward_extra_info"])
    assert extra.pop("nvrm_raw_reward") == want[0] and extra.pop("nvrm_uncertainty") >= 0  # the demo bundle has a guard
    assert extra == {"nvrm_ok": 1.0, "nvrm_off_contract": 0.0}
    # [C, T, H, W] (how verl-omni's own video rewards read a sample) gives the same rewards
    cthw = [(d, s.permute(1, 0, 2, 3), g, i) for d, s, g, i in omni_samples(ctx, vids[:1])]
    assert asyncio.run(gather_visual(fn, cthw))[0]["reward_score"] == want[0]


def test_verl_omni_multi_manager_loads_compute_score_by_name_and_counts_a_failure_as_zero(demo):
    model, ctx, cands = demo
    vids, fps = rollouts(cands, 2)
    def load(path, name):  # verl's load_extern_object, for its pkg:// form
        return getattr(importlib.import_module(path.removeprefix("pkg://")), name)

    from nvrm.cli.demo import demo_bundle_path

    entry = {"path": "pkg://nvrm.rl.verl_omni", "name": "compute_score", "weight": 1.0, "model": str(demo_bundle_path()), "device": "cpu",
             "context_key": "context_video", "fps": fps}
    samples = omni_samples(ctx, vids)
    samples[1][3].pop("context_video")

    async def run(cfg):
        loop = asyncio.get_running_loop()
        subs = verl_omni_reward_managers.build_sub_rewards(cfg, load)
        return await asyncio.gather(*(verl_omni_reward_managers.multi_run_single(subs, loop, *s, output_type="np") for s in samples))

    ok, failed = asyncio.run(run({"nvrm": entry}))
    assert ok["reward_score"] == model.score(PROMPT, ctx, Clip(vids[0], fps)).reward
    assert failed["reward_score"] == 0.0 and failed["reward_extra_info"]["reward/nvrm"] == 0.0  # verl-omni's convention
    with pytest.raises(RuntimeError, match="Required sub-reward 'nvrm' failed: .*no context"):
        asyncio.run(run({"nvrm": {**entry, "required": True}}))


def test_verl_omni_refuses_images_latents_and_unknown_settings(demo):
    model, ctx, _ = demo
    fn = verl_omni_compute_score(model, context_key="context_video", coalesce_ms=0)
    info = {"context_video": str(ctx)}
    with pytest.raises(RewardFnError, match="a still image is not a 5 s continuation"):
        fn(data_source="x", solution_image=torch.zeros(3, 48, 64, dtype=torch.uint8), ground_truth=PROMPT, extra_info=info)
    with pytest.raises(RewardFnError, match="float tensor .*output_type: latent"):
        fn(data_source="x", solution_image=torch.zeros(16, 4, 6, 8), ground_truth=PROMPT, extra_info=info)
    with pytest.raises(ConfigError, match="unknown setting.*contxt_key"):
        verl_omni_compute_score(model, contxt_key="context_video")



# ---------------------------------------------------------------- against nvrm serve (the client, the service app in process)


def test_each_caller_against_the_server_matches_in_process(demo):
    from helpers import InProcessServer

    model, ctx, cands = demo
    vids, fps = rollouts(cands, 2)
    want = [model.score(PROMPT, ctx, Clip(v, fps)).reward for v in vids]
    with InProcessServer(model, allow_dirs=(str(ctx.parent),)) as server:  # the clips are paths on this machine
        client = server.client()
        got = VideoAlignReward(client, keys=("MQ",), context=str(ctx)).reward([str(cands[k]) for k in KINDS[:2]], [PROMPT] * 2)
        assert [g["MQ"] for g in got] == [model.score(PROMPT, ctx, cands[k]).reward for k in KINDS[:2]]
        fast = FastVideoReward(client, fps=fps, context=str(ctx)).compute_reward(as_float_btchw(vids), [PROMPT] * 2)
        assert fast.tolist() == want
        omni = verl_omni_compute_score(client, context_key="context_video", fps=fps, coalesce_ms=0)
        assert [omni(*s)["score"] for s in omni_samples(ctx, vids)] == want
