"""The conservative reward, ``reward - λ * uncertainty``: the one check every adapter makes before asking for it.

Torch-free, so the RL adapters' URL mode and the client check ``conservative=`` without loading a model.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError


def check_conservative(value: Any, guard: Any, where: str = "conservative") -> float | None:
    """``value`` as λ (a finite number >= 0), or None when not asked for; a one-line ``ConfigError`` when it is not a
    number, or when it is asked for and ``guard`` is None (a bundle without a guard never hands out a raw reward as a
    conservative one)."""
    if value is None or value is False:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{where}={value!r}: must be a number >= 0 (the weight λ of reward - λ * uncertainty)") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}={value!r}: must be a finite number >= 0 (the weight λ of reward - λ * uncertainty)")
    if guard is None:
        raise ConfigError(
            f"{where}={value:g}: this model has no guard, so it has no uncertainty to be conservative with; "
            "fit one with nvrm guard fit (or drop conservative=)"
        )
    return float(value)


def conservative_reward(reward: float, uncertainty: float | None, weight: float) -> float:
    """``reward - weight * uncertainty`` (pure); the uncertainty must be there."""
    if uncertainty is None:
        raise ConfigError("a conservative reward was asked for an item without an uncertainty (its model has no guard)")
    return float(reward) - float(weight) * float(uncertainty)
