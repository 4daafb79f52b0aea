"""Real CUDA behaviour: run by bench/gpu.sh on a GPU machine, skipped everywhere else."""

from __future__ import annotations

import pytest
import torch

from helpers import BATCH_ULPS, GROUP_ULPS, bf16_ulp
from nvrm import Clip, RewardModel
from nvrm.model import to_device
from nvrm.synth.clips import moving_square

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CTX = Clip(moving_square(24, 96, 128, seed=1), fps=4)
CANDS = [Clip(moving_square(24, 96, 128, seed=10 + i, speed=1 + i), fps=4) for i in range(6)]


@pytest.fixture(scope="module")
def cuda_model(tiny_bundle):
    m = RewardModel.from_pretrained(tiny_bundle, device="cuda")
    yield m
    m.close()


def test_transfers_are_pinned_and_asynchronous():
    t = torch.arange(1 << 16, dtype=torch.uint8)
    moved = to_device(t, torch.device("cuda"))
    torch.cuda.synchronize()
    assert moved.is_cuda and torch.equal(moved.cpu(), t)
    assert t.pin_memory().is_pinned()


def test_attention_choice_and_vision_path(cuda_model):
    try:
        import flash_attn  # noqa: F401

        want = "flash_attention_2"
    except ImportError:
        want = "sdpa"
    assert cuda_model.backbone.config._attn_implementation == want
    assert cuda_model.vision is not None and cuda_model.engine.codec is not None


def test_score_on_cuda_equals_the_plain_reference(cuda_model, tiny_bundle, clips):
    from nvrm.reference import ReferenceScorer, reference_images

    ref = ReferenceScorer(tiny_bundle, device="cuda")
    ctx, _ = reference_images(clips["context"], "context", cuda_model.contract)
    cand, _ = reference_images(clips["cand_a"], "candidate", cuda_model.contract)
    assert cuda_model.score("p", clips["context"], clips["cand_a"]).reward == ref.reward(ref.inputs("p", ctx, cand))


def test_group_and_exact_on_cuda(cuda_model):
    single = [cuda_model.score("p", CTX, c).reward for c in CANDS]
    group = [r.reward for r in cuda_model.score_group("p", CTX, CANDS)]
    assert all(abs(a - b) <= GROUP_ULPS * bf16_ulp(a) for a, b in zip(single, group))
    assert [r.reward for r in cuda_model.score_group("p", CTX, CANDS, exact=True)] == single


def test_out_of_memory_splits_the_batch_on_the_real_allocator(cuda_model):
    items = [("p", CTX, c) for c in CANDS]
    single = [cuda_model.score(*it).reward for it in items]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    cuda_model.score_batch(items[:1])
    one = torch.cuda.max_memory_allocated() - base
    free, _ = torch.cuda.mem_get_info()
    # leave room for about two items' worth of activations, then ask for all six at once
    filler = torch.empty(max(0, free - 3 * one - (64 << 20)), dtype=torch.uint8, device="cuda")
    old = cuda_model.max_batch_tokens
    cuda_model.max_batch_tokens = 10**9
    try:
        got = [r.reward for r in cuda_model.score_batch(items)]
    finally:
        cuda_model.max_batch_tokens = old
        del filler
        torch.cuda.empty_cache()
    assert all(abs(a - b) <= BATCH_ULPS * bf16_ulp(a) for a, b in zip(single, got))
