import random

import pytest

from nvrm.forward.batching import plan_batches


@pytest.mark.parametrize("seed", range(5))
def test_every_item_once_and_budget_respected(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(50, 900) for _ in range(40)]
    batches = plan_batches(lengths, 2000)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(40))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 2000


def test_oversized_item_runs_alone():
    assert plan_batches([5000, 10, 10], 100) == [[0], [1, 2]]




def test_invalid_budget():
    with pytest.raises(ValueError):
        plan_batches([1], 0)
