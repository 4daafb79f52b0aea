"""score_group (shared-prefix KV reuse) equals scoring each candidate alone."""

import math

import pytest
import torch

from nvrm import Clip, Contract, ContractError, InputError, RewardModel
from nvrm.engine.encode import to_pixel_values
from nvrm.synth.clips import moving_square
from helpers import GROUP_ULPS, bf16_ulp

CTX = Clip(moving_square(40, 96, 128, seed=1), fps=4)
SIZES = [(96, 128), (64, 80), (120, 90), (96, 128), (200, 48), (144, 176)]
CANDS = [Clip(moving_square(24, *sz, seed=10 + i, speed=1 + i), fps=4) for i, sz in enumerate(SIZES)]




def test_group_inputs_equal_per_item_inputs(model):
    ctx = model.prepare_video(CTX, "context")
    cands = [model.prepare_video(c, "candidate") for c in CANDS]
    enc = model.engine.encode_group("p", ctx, cands)
    assert len({len(s) for s in enc.ids}) > 1  # different resolutions -> different suffix lengths
    for i, c in enumerate(CANDS):
        ref = model.prepare("p", CTX, c).encoded
        assert torch.equal(enc.ids[i], ref.input_ids)
        assert torch.equal(enc.positions[i], ref.positions)
        pixels = torch.cat([enc.context_pixels, enc.candidate_pixels[i]])
        assert torch.equal(to_pixel_values(pixels, enc.codec), ref.pixel_values)
        assert torch.equal(torch.cat([enc.context_grid, enc.candidate_grids[i]]), ref.image_grid_thw)
    assert 0 < enc.prefix_len < min(len(s) for s in enc.ids)


@pytest.mark.slow
def test_group_equals_single_within_the_measured_tolerance(model):
    group = model.score_group("A prompt", CTX, CANDS)
    for c, g in zip(CANDS, group):
        s = model.score("A prompt", CTX, c)
        assert abs(s.reward - g.reward) <= GROUP_ULPS * bf16_ulp(s.reward)
        assert (s.num_tokens, s.candidate_times, s.context_times) == (g.num_tokens, g.candidate_times, g.context_times)


def test_group_equals_single_in_float32(model32):
    single = [model32.score("A prompt", CTX, c).reward for c in CANDS]
    group = [r.reward for r in model32.score_group("A prompt", CTX, CANDS)]
    assert max(single) - min(single) > 1e-3  # the candidates really differ
    assert group == pytest.approx(single, abs=1e-4)


def test_chunked_suffix_batches_equal_one_batch(model32):
    whole = [r.reward for r in model32.score_group("p", CTX, CANDS)]
    old = model32.max_batch_tokens
    model32.max_batch_tokens = 1200  # forces one candidate per forward
    try:
        chunked = [r.reward for r in model32.score_group("p", CTX, CANDS)]
    finally:
        model32.max_batch_tokens = old
    assert chunked == pytest.approx(whole, abs=1e-5)


@pytest.mark.slow
def test_single_candidate_group_and_compare_rank(model):
    [one] = model.score_group("p", CTX, CANDS[:1])
    assert abs(one.reward - model.score("p", CTX, CANDS[0]).reward) <= GROUP_ULPS * bf16_ulp(one.reward)
    ranking = model.rank("p", CTX, CANDS)
    assert sorted(e.index for e in ranking) == list(range(len(CANDS)))
    assert [e.rank for e in ranking] == list(range(1, len(CANDS) + 1))
    assert all(a.reward >= b.reward for a, b in zip(ranking, ranking[1:]))
    p = model.compare("p", CTX, CANDS[0], CANDS[1])
    ra, rb = (model.score("p", CTX, c).reward for c in CANDS[:2])
    assert p == pytest.approx(1 / (1 + math.exp(-(ra - rb))), abs=0.01)


def test_bad_candidate_in_group(model):
    short = Clip(moving_square(12, 96, 128), fps=4)  # 3 s
    out = model.score_group("p", CTX, [CANDS[0], short, CANDS[1]], errors="return")
    assert isinstance(out[1], ContractError) and "3.00 s" in str(out[1])
    assert abs(out[0].reward - model.score("p", CTX, CANDS[0]).reward) <= GROUP_ULPS * bf16_ulp(out[0].reward)
    with pytest.raises(ContractError):
        model.score_group("p", CTX, [CANDS[0], short])
    with pytest.raises(InputError, match="context"):
        model.score_group("p", "/nonexistent.mp4", CANDS[:2], errors="return")


@pytest.mark.slow
def test_compiled_model_scores_like_eager(tiny_bundle, model32):
    from nvrm.errors import ConfigError
    from nvrm.forward.cpu_attention import cpu_attention_degraded

    if cpu_attention_degraded():  # a lowered ATEN_CPU_CAPABILITY on an AMX CPU: compiled attention is broken in torch
        with pytest.raises(ConfigError, match="compile=True.*NaN"):
            RewardModel.from_pretrained(tiny_bundle, device="cpu", dtype=torch.float32, contract=Contract(head_dtype="float32"), compile=True)
        return
    compiled = RewardModel.from_pretrained(
        tiny_bundle, device="cpu", dtype=torch.float32, contract=Contract(head_dtype="float32"), compile=True
    )
    assert compiled.backbone.language_model._compiled_call_impl is not None  # really wrapped
    eager = [r.reward for r in model32.score_group("p", CTX, CANDS[:3])]
    assert [r.reward for r in compiled.score_group("p", CTX, CANDS[:3])] == pytest.approx(eager, abs=1e-4)
    single = model32.score("p", CTX, CANDS[1]).reward
    assert compiled.score("p", CTX, CANDS[1]).reward == pytest.approx(single, abs=1e-4)
