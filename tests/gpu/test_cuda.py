"""Real CUDA behaviour: run by benchmarks/gpu.sh on a GPU machine, skipped everywhere else."""

from __future__ import annotations

import pytest
import torch

from helpers import BATCH_ULPS, GROUP_ULPS, bf16_ulp, ulps
from nvrm import Clip, RewardModel
from nvrm.forward.model import to_device
from nvrm.synth.clips import moving_square

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CTX = Clip(moving_square(24, 96, 128, seed=1), fps=4)
CANDS = [Clip(moving_square(24, 96, 128, seed=10 + i, speed=1 + i), fps=4) for i in range(6)]


@pytest.fixture(scope="module")
def cuda_model(tiny_bundle):
    m = RewardModel.from_pretrained(tiny_bundle, device="cuda")
    yield m
    m.close()


def test_transfers_arrive_intact():
    t = torch.arange(1 << 16, dtype=torch.int64) % 251
    moved = to_device(t.to(torch.uint8), torch.device("cuda"))
    torch.cuda.synchronize()
    assert moved.is_cuda and torch.equal(moved.cpu(), t.to(torch.uint8))


def test_attention_choice_and_vision_path(cuda_model):
    try:
        import flash_attn  # noqa: F401

        want = "flash_attention_2"
    except ImportError:
        want = "sdpa"
    assert cuda_model.backbone.visual.config._attn_implementation == want
    assert cuda_model.packed == (want == "sdpa")
    assert cuda_model.vision is not None and cuda_model.engine.codec is not None


def test_score_on_cuda_equals_the_plain_reference(cuda_model, tiny_bundle, clips):
    from nvrm.fidelity.reference import ReferenceScorer, reference_images

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


def test_batch_on_cuda_within_the_bound_and_exact(cuda_model):
    """score_batch against score computed on this GPU (never against CPU-recorded rewards)."""
    items = [(f"prompt {i}", Clip(moving_square(4 * t, *size, seed=10 + i), fps=4), Clip(moving_square(24, *size, seed=20 + i, speed=5), fps=4))
             for i, (t, size) in enumerate([(3, (64, 80)), (9, (96, 128)), (1, (48, 200)), (6, (120, 90))])]
    single = [cuda_model.score(*it).reward for it in items]
    got = [r.reward for r in cuda_model.score_batch(items)]
    assert max(ulps(a, b) for a, b in zip(single, got)) <= BATCH_ULPS
    assert [r.reward for r in cuda_model.score_batch(items, exact=True)] == single


def test_deep_bundle_drift_on_cuda(tmp_path_factory):
    """At the release's depth (36 text layers) group and batch stay within the stated bounds on the GPU."""
    from nvrm.synth.bundles import ArchSpec, build_tiny_bundle

    path = build_tiny_bundle(tmp_path_factory.mktemp("deep-cuda") / "deep36", ArchSpec.from_name("deep"), revision="deep-36")
    with RewardModel.from_pretrained(path, device="cuda") as deep:
        for k in range(3):
            ctx = Clip(moving_square(4 + 4 * k, 64 + 16 * k, 80, seed=k), fps=4)
            cands = [Clip(moving_square(24, *sz, seed=10 + i + 7 * k, speed=1 + i), fps=4) for i, sz in enumerate([(96, 128), (64, 80), (120, 90), (200, 48)])]
            single = [deep.score(f"p{k}", ctx, c).reward for c in cands]
            group = [r.reward for r in deep.score_group(f"p{k}", ctx, cands)]
            batch = [r.reward for r in deep.score_batch([(f"p{k}", ctx, c) for c in cands])]
            assert max(ulps(a, b) for a, b in zip(single, group)) <= GROUP_ULPS
            assert max(ulps(a, b) for a, b in zip(single, batch)) <= BATCH_ULPS
            assert [r.reward for r in deep.score_group(f"p{k}", ctx, cands, exact=True)] == single
