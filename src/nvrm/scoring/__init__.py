"""Scoring: ``RewardModel`` and what it is made of, in the order a score flows.

- ``reward_model``: the public API (``score``, ``score_batch``, ``score_group``, ``score_groups``);
- ``loading``: settings resolved, the bundle's parts loaded and checked;
- ``items``: what callers hand in (items, groups) and the per-slot error policy;
- ``streaming``: prepared work from the engine to the forward, groups overlapped;
- ``differentiable``: the reward with gradients to candidate pixels.

``from nvrm.scoring import RewardModel`` works; the submodules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["RewardModel"]


def __getattr__(name: str) -> Any:
    if name == "RewardModel":
        from .reward_model import RewardModel

        return RewardModel
    raise AttributeError(f"module 'nvrm.scoring' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from .reward_model import RewardModel
