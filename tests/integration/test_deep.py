"""At the release's depth (36 text layers, narrow), group and batch scoring agree with score()
within the bounds of nvrm.fidelity.numerics (measured by benchmarks/drift_sweep.py), packed batches are
bit-identical on the CPU, and exact=True is bit-identical."""

from __future__ import annotations

import pytest

from helpers import BATCH_ULPS, GROUP_ULPS, ulps
from nvrm import Clip, RewardModel
from nvrm.synth.clips import moving_square

SIZES = [(96, 128), (64, 80), (120, 90), (200, 48), (64, 80)]


@pytest.fixture(scope="module")
def deep(deep_bundle):
    m = RewardModel.from_pretrained(deep_bundle, device="cpu")
    yield m
    m.close()


@pytest.mark.slow
@pytest.mark.parametrize("k", range(3))
def test_deep_group_and_batch_within_the_measured_tolerance(deep, k):
    ctx = Clip(moving_square(4 + 4 * k, 64 + 16 * k, 80, seed=k), fps=4)
    cands = [Clip(moving_square(24, *sz, seed=10 + i + 7 * k, speed=1 + i), fps=4) for i, sz in enumerate(SIZES)]
    prompt = f"prompt {k}"
    single = [deep.score(prompt, ctx, c).reward for c in cands]
    group = [r.reward for r in deep.score_group(prompt, ctx, cands)]
    batch = [r.reward for r in deep.score_batch([(prompt, ctx, c) for c in cands])]
    assert max(ulps(s, g) for s, g in zip(single, group)) <= GROUP_ULPS
    assert max(ulps(s, b) for s, b in zip(single, batch)) <= BATCH_ULPS
    if deep.packed and deep.device.type == "cpu":
        assert batch == single  # packed rows run the same kernels as score()
        assert group == single  # the prefix KV comes from a sequence of each candidate's own length
    assert [r.reward for r in deep.score_group(prompt, ctx, cands, exact=True)] == single
    assert [r.reward for r in deep.score_batch([(prompt, ctx, c) for c in cands], exact=True)] == single
