"""The training schedule (pure): the learning rate's warm-up and cosine, and the tie margin."""

import math
from types import SimpleNamespace

import pytest

from nvrm.errors import InputError
from nvrm.train.config import TrainConfig
from nvrm.train.schedule import lr_factor, tie_margin


def test_the_rate_warms_up_linearly_then_falls_on_a_cosine_to_a_tenth():
    assert [lr_factor(s, 4, 20) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 4, 20) == pytest.approx(1.0)
    assert lr_factor(12, 4, 20) == pytest.approx(0.55)  # half way down
    assert lr_factor(20, 4, 20) == pytest.approx(0.1) and lr_factor(99, 4, 20) == pytest.approx(0.1)
    assert lr_factor(0, 0, 10) == pytest.approx(1.0)


def test_the_tie_margin_is_log_2_with_ties_and_must_be_positive():
    tied, plain = [SimpleNamespace(tie=True)], [SimpleNamespace(tie=False)]
    assert tie_margin(TrainConfig(), tied) == pytest.approx(math.log(2)) and tie_margin(TrainConfig(), plain) == 0.0
    assert tie_margin(TrainConfig(tie_margin=0.3), plain) == 0.3
    with pytest.raises(InputError, match="tie margin > 0"):
        tie_margin(TrainConfig(tie_margin=0.0), tied)
