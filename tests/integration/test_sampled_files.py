"""A ``.npy`` of sampled frames (the rollout record's files) reads as the sampled video it is: scoring, the judges' frames, training's inputs."""

from __future__ import annotations

import numpy as np
import pytest

from nvrm import Clip
from nvrm.errors import InputError
from nvrm.synth.clips import moving_square


def test_sampled_frames_in_a_npy_score_as_the_clip_they_were_sampled_from(model, tmp_path):
    ctx, cand = moving_square(24, 64, 96, seed=1), moving_square(40, 64, 96, seed=2)
    np.save(tmp_path / "ctx.npy", ctx[::8])  # 8 fps clips, sampled at 1 fps: frames 0, 8, 16, ...
    np.save(tmp_path / "cand.npy", cand[::8][:5])
    from_files = model.score("p", str(tmp_path / "ctx.npy"), str(tmp_path / "cand.npy"))
    from_clips = model.score("p", Clip(ctx, 8), Clip(cand, 8))
    assert from_files.reward == from_clips.reward and from_files.candidate_times == (0.0, 1.0, 2.0, 3.0, 4.0)


def test_the_judges_frames_of_a_npy_and_a_bad_npy_is_one_line(tmp_path):
    from nvrm.prefs.judge_contract import JudgeContract, video_images
    from nvrm.video.decode import decode_frames

    np.save(tmp_path / "c.npy", moving_square(5, 64, 96, seed=3))
    frames, rate = decode_frames(str(tmp_path / "c.npy"))
    assert frames.shape == (5, 64, 96, 3) and rate == 1.0
    assert len(video_images(str(tmp_path / "c.npy"), "candidate", JudgeContract())) >= 1
    np.save(tmp_path / "bad.npy", np.zeros((3, 4), np.float32))
    with pytest.raises(InputError, match=r"bad.npy: a .npy of sampled frames must hold uint8 \(T, H, W, 3\)") as e:
        decode_frames(str(tmp_path / "bad.npy"))
    assert "\n" not in str(e.value)
    (tmp_path / "pickle.npy").write_bytes(b"\x80\x04\x95not an array")
    with pytest.raises(InputError, match="not a .npy array of frames"):
        decode_frames(str(tmp_path / "pickle.npy"))
