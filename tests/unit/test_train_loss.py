"""Bradley-Terry and Rao-Kupper tie losses (pure)."""

import math

import pytest
import torch

from nvrm.train.loss import log_p_tie, log_p_win, pair_loss


def test_bradley_terry_is_softplus_of_minus_margin():
    d = torch.tensor([-3.0, 0.0, 0.5, 4.0])
    no_ties = torch.zeros(4, dtype=torch.bool)
    assert pair_loss(d, no_ties).item() == pytest.approx(torch.nn.functional.softplus(-d).mean().item())
    assert pair_loss(torch.tensor([0.0]), torch.tensor([False])).item() == pytest.approx(math.log(2))


@pytest.mark.parametrize("tau", [0.1, math.log(2), 2.0])
def test_rao_kupper_outcomes_sum_to_one_and_ties_peak_at_zero(tau):
    d = torch.linspace(-6, 6, 49, dtype=torch.float64)
    total = log_p_win(d, tau).exp() + log_p_win(-d, tau).exp() + log_p_tie(d, tau).exp()
    assert torch.allclose(total, torch.ones_like(total), atol=1e-12)
    tie = log_p_tie(d, tau)
    assert int(tie.argmax()) == 24  # d = 0
    assert log_p_tie(torch.tensor([0.0], dtype=torch.float64), tau).exp().item() == pytest.approx(1 - 2 / (1 + math.exp(tau)))


def test_tie_gradient_pulls_rewards_together_and_needs_a_margin():
    d = torch.tensor([1.5, -2.0], requires_grad=True)
    pair_loss(d, torch.tensor([True, True]), tau=math.log(2)).backward()
    assert d.grad[0] > 0 and d.grad[1] < 0  # descent moves both toward 0
    with pytest.raises(ValueError, match="tie margin"):
        pair_loss(torch.tensor([0.0]), torch.tensor([True]), tau=0.0)
    mixed = pair_loss(torch.tensor([2.0, 0.0]), torch.tensor([False, True]), tau=1.0)
    want = (-log_p_win(torch.tensor(2.0), 1.0) - log_p_tie(torch.tensor([0.0]), 1.0)[0]) / 2
    assert mixed.item() == pytest.approx(want.item())
