"""Bounded work for every input: each hostile case from the probe, checked before the work it protects."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from nvrm import Clip, Contract, InputError, RewardModel
from nvrm.errors import ConfigError, LimitError
from nvrm.video.inputs import prepare_input
from nvrm.limits import Limits
from nvrm.synth.clips import moving_square, write_video
from nvrm.video.sampling import context_ticks

C = Contract()
CAND = Clip(moving_square(24, 64, 80, seed=2), fps=4)


def write_blank(path, width: int, height: int, frames: int, fps: float = 8, codec: str = "libx264") -> str:
    """A tiny file that declares a large or long video (black frames compress to almost nothing)."""
    with av.open(str(path), "w") as out:
        s = out.add_stream(codec, rate=Fraction(fps).limit_denominator(1000))
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"preset": "ultrafast", "crf": "51"}
        f = av.VideoFrame(width, height, "yuv420p")
        for p in f.planes:
            p.update(bytes(p.buffer_size))
        for i in range(frames):
            f.pts = i
            for pk in s.encode(f):
                out.mux(pk)
        for pk in s.encode():
            out.mux(pk)
    return str(path)


def test_limits_are_validated():
    with pytest.raises(ConfigError, match="max_prompt_tokens=0"):
        Limits(max_prompt_tokens=0)
    with pytest.raises(ConfigError, match="min_fps=10 is above max_fps=5"):
        Limits(min_fps=10, max_fps=5)


# 1. a long prompt


def test_a_megabyte_prompt_is_refused_without_tokenising_it(model, monkeypatch):
    calls = []
    tok = model.engine.processor.tokenizer
    real = type(tok).__call__
    monkeypatch.setattr(type(tok), "__call__", lambda self, *a, **k: calls.append(len(a[0]) if a else 0) or real(self, *a, **k))
    from nvrm.engine.tasks import item_job

    for prompt in ("word " * 200_000, "a" * 262_145):  # a megabyte, and one byte past 64 bytes per allowed token
        with pytest.raises(LimitError, match=rf"prompt: is {len(prompt)} bytes, more than 64 bytes per token allows \(refused without tokenising\)"):
            model.engine._workers.run_inline(item_job, prompt, CAND, CAND)
    assert not any(n > 100_000 for n in calls)  # neither was handed to the tokenizer


def test_a_long_prompt_is_counted_and_refused(tiny_bundle):
    with RewardModel.from_pretrained(tiny_bundle, device="cpu", limits=Limits(max_prompt_tokens=50)) as m:
        with pytest.raises(LimitError, match="max_prompt_tokens=50"):
            m.score("a " * 200, CAND, CAND)
        assert m.score("a " * 10, CAND, CAND).num_tokens > 0


def test_a_prompt_with_a_lone_surrogate_is_an_input_error(model):
    with pytest.raises(InputError, match="prompt: is not valid Unicode text"):
        model.score("bad \ud800 text", CAND, CAND)


# 2. absurd frame rates


@pytest.mark.parametrize("fps", [1e-308, 1e-3, 5e4])
def test_absurd_clip_frame_rates_are_refused_before_planning(model, fps):
    ctx = Clip(np.zeros((16, 8, 8, 3), np.uint8), fps=fps)
    with pytest.raises(LimitError, match="outside min_fps"):
        model.score("p", ctx, CAND)


def test_a_long_slow_clip_is_refused_by_duration(tiny_bundle):
    with RewardModel.from_pretrained(tiny_bundle, device="cpu", limits=Limits(min_fps=1e-6)) as m:
        with pytest.raises(LimitError, match="context is 16000 s long, over the limit max_context_seconds=600"):
            m.score("p", Clip(np.zeros((16, 8, 8, 3), np.uint8), fps=1e-3), CAND)


def test_context_ticks_never_loop_forever():
    with pytest.raises(InputError, match="not a usable context length"):
        context_ticks(float("inf"), C)
    with pytest.raises(InputError, match="not a usable context length"):
        context_ticks(1e12, C)


# 3. decompression bombs, under a memory limit


@pytest.mark.slow
def test_a_decompression_bomb_is_refused_from_its_header_within_a_memory_bound(tmp_path):
    bomb = write_blank(tmp_path / "bomb.mp4", 8192, 8192, 3)
    assert (tmp_path / "bomb.mp4").stat().st_size < 300_000
    script = textwrap.dedent(
        f"""
        import re, resource, sys
        from nvrm import Contract
        from nvrm.errors import LimitError
        from nvrm.video.inputs import prepare_input
        vm = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))  # 256 MB more at most
        try:
            prepare_input({bomb!r}, "context", Contract())
        except LimitError as e:
            print("refused:", e)
            sys.exit(0)
        sys.exit(1)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "source frames are 8192x8192 (67108864 pixels), over the limit max_source_pixels" in out.stdout


def test_a_legal_large_source_is_decoded_frame_by_frame(tmp_path, monkeypatch):
    """Each sampled frame is reduced to the contract's size as it is decoded, never kept at full size."""
    import nvrm.video.frames as frames

    path = write_video(tmp_path / "big.mp4", moving_square(16, 720, 1280, seed=3), 8)
    alive = []
    real = frames.prepare_frame

    def spy(image, contract, source="frame"):
        alive.append(image.size)
        return real(image, contract, source)

    monkeypatch.setattr("nvrm.video.inputs.prepare_frame", spy)
    video = prepare_input(path, "context", C)
    assert len(video.images) == 2 and all(im.height <= 360 for im in video.images)
    assert alive and all(size == (1280, 720) for size in alive)  # transformed straight from the decoder


# 4. long contexts, many frames, big groups


def test_a_thirty_minute_context_file_is_refused_before_decoding(tmp_path, monkeypatch):
    path = write_blank(tmp_path / "long.mp4", 64, 64, 1800, fps=1)
    assert (tmp_path / "long.mp4").stat().st_size < 200_000
    decoded = []
    monkeypatch.setattr(av.VideoFrame, "to_image", lambda self, *a, **k: decoded.append(1))
    with pytest.raises(LimitError, match="context is 1800 s long, over the limit max_context_seconds=600"):
        prepare_input(path, "context", C)
    assert not decoded


def test_too_many_context_frames_are_refused(tiny_bundle):
    with RewardModel.from_pretrained(tiny_bundle, device="cpu", limits=Limits(max_context_samples=8)) as m:
        with pytest.raises(LimitError, match="context has 10 sampled frames, over the limit max_context_samples=8"):
            m.score("p", Clip(moving_square(40, 32, 32), fps=4), CAND)
        with pytest.raises(LimitError, match="max_context_samples=8"):
            m.score("p", [np.zeros((32, 32, 3), np.uint8)] * 9, CAND)


def test_groups_over_the_candidate_limit_are_refused_whole(tiny_bundle):
    with RewardModel.from_pretrained(tiny_bundle, device="cpu", limits=Limits(max_group_candidates=3)) as m:
        out = list(m.score_groups([("p", CAND, [CAND] * 4)]))
        assert len(out[0]) == 4 and all(isinstance(e, LimitError) and "max_group_candidates=3" in str(e) for e in out[0])


@pytest.mark.slow
def test_a_big_group_is_prepared_a_few_chunks_at_a_time(tiny_bundle, monkeypatch):
    import nvrm.engine.core as core
    from nvrm.scoring import streaming

    with RewardModel.from_pretrained(tiny_bundle, device="cpu", group_chunk=4) as m:
        submitted, scored = [], []
        real_submit, real_chunk = core.Engine.submit_group, streaming.score_chunk

        def submit(self, prompt, context, cands):
            submitted.append(len(cands))
            return real_submit(self, prompt, context, cands)

        def chunk(pipe, group, prefix, exact):
            scored.append(len(submitted))
            return real_chunk(pipe, group, prefix, exact)

        monkeypatch.setattr(core.Engine, "submit_group", submit)
        monkeypatch.setattr(streaming, "score_chunk", chunk)
        short = Clip(moving_square(8, 64, 80), fps=4)
        cands = [CAND] * 9 + [short] + [CAND] * 10  # 20 candidates, one bad, 5 chunks
        out = m.score_group("p", CAND, cands, errors="return")
        assert [isinstance(r, InputError) for r in out] == [i == 9 for i in range(20)]
        assert sum(submitted) == 20 and max(submitted) == 4
        assert all(n <= k + 2 for k, n in enumerate(scored))  # chunk k is scored with at most k + 2 submitted


# 7. truncated containers


def test_a_truncated_mkv_context_is_an_error_not_a_shorter_clip(tmp_path):
    full = write_video(tmp_path / "full.mkv", moving_square(64, 64, 80, seed=1), 8)
    data = full.read_bytes()
    (tmp_path / "cut.mkv").write_bytes(data[: int(len(data) * 0.3)])
    assert prepare_input(full, "context", C).times[-1] == 7.0
    with pytest.raises(InputError, match="is truncated: the container declares 8.00 s"):
        prepare_input(tmp_path / "cut.mkv", "context", C)


def test_a_ten_minute_context_at_1_fps_passes_the_default_limits():
    """The documented 600 s context (600 samples at 1 FPS) is within the default limits; 601 s is not."""
    from nvrm.video.sampling import context_ticks

    L = Limits()
    L.check_context_duration(600.0, "ctx")
    L.check_context_frames(len(context_ticks(600.0, C)), "ctx")
    with pytest.raises(LimitError, match="max_context_samples=600"):
        L.check_context_frames(len(context_ticks(601.0, C)), "ctx")


def test_the_sequence_limit_holds_on_every_path(tiny_bundle):
    """score, score_batch, score_group and exact mode all refuse a sequence over max_sequence_tokens."""
    ctx = Clip(moving_square(8, 64, 80, seed=1), fps=4)
    with RewardModel.from_pretrained(tiny_bundle, device="cpu", limits=Limits(max_sequence_tokens=100)) as m:
        with pytest.raises(LimitError, match="max_sequence_tokens=100"):
            m.score("p", ctx, CAND)
        assert isinstance(m.score_batch([("p", ctx, CAND)], errors="return")[0], LimitError)
        assert isinstance(m.score_group("p", ctx, [CAND], errors="return")[0], LimitError)
        assert isinstance(m.score_group("p", ctx, [CAND], errors="return", exact=True)[0], LimitError)
        # refused at birth, once: the engine's item job raises, and a group's row becomes its slot's error
        with pytest.raises(LimitError, match="max_sequence_tokens=100"):
            m.engine.prepare_item("p", ctx, CAND)
        group = m.engine.prepare_group("p", ctx, [CAND])
        assert group.good == [] and group.encoded is None and isinstance(group.slot_error(0), LimitError)
        with pytest.raises(LimitError, match="candidate 0.*max_sequence_tokens=100"):
            m.differentiable()("p", ctx, torch.from_numpy(CAND.frames).float() / 255, fps=CAND.fps)
