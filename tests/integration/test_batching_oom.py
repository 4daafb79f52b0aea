"""score_batch splits a batch that runs out of memory instead of failing."""

import pytest
import torch

import nvrm.forward.runtime as scoring
from nvrm import Clip
from nvrm.synth.clips import moving_square


@pytest.mark.slow
def test_oom_batch_is_split_and_retried(model, monkeypatch):
    items = [("p", Clip(moving_square(8, 64, 80, seed=i), fps=2), Clip(moving_square(12, 64, 80, seed=9 + i), fps=2)) for i in range(5)]
    expected = [r.reward for r in model.score_batch(items)]
    real = scoring.forward_rewards
    sizes = []

    def flaky(backbone, head, batch, **kw):
        sizes.append(batch.input_ids.shape[0])
        if batch.input_ids.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(backbone, head, batch, **kw)

    monkeypatch.setattr(scoring, "forward_rewards", flaky)
    got = [r.reward for r in model.score_batch(items)]
    assert sizes == [5, 2, 3, 1, 2]  # 5 fails -> 2 + 3; 3 fails -> 1 + 2
    assert got == pytest.approx(expected, abs=0.02)


def test_oom_on_a_single_item_is_raised(model, monkeypatch):
    def always(*a, **k):
        raise torch.OutOfMemoryError("simulated")

    monkeypatch.setattr(scoring, "forward_rewards", always)
    with pytest.raises(torch.OutOfMemoryError):
        model.score("p", Clip(moving_square(8, 64, 80), fps=2), Clip(moving_square(12, 64, 80), fps=2))
