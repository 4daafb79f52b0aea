"""``nvrm.source.reward_source`` under its old name: the one scorer behind every reward function (re-exported).

It moved below ``nvrm.rl`` and ``nvrm.prefs`` (issue 55), so nvrm's own judge uses it without importing the RL
adapters; new code imports ``nvrm.source.reward_source``.
"""

from ..source.reward_source import RewardSource, context_key, group_items, is_url, registry, shared_model

__all__ = ["RewardSource", "context_key", "group_items", "is_url", "registry", "shared_model"]
