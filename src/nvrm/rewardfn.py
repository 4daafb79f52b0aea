"""``make_reward_fn``: the reward as a plain function for RL loops.

    fn = nvrm.make_reward_fn("artifacts/WORL-NVRM")          # in-process
    fn = nvrm.make_reward_fn("http://127.0.0.1:8000")        # a running nvrm serve
    rewards = fn(prompts, contexts, candidates)               # list[float], in order

Items that share a prompt and context (a GRPO group) are scored together with
shared-context reuse. A failed item raises ``RewardFnError`` naming every
failed index; ``on_error="nan"``, ``"group_mean"`` or a number fills failed
slots instead, on request only, never silently. The scorer and the failure
policies are the RL adapters' own (``nvrm.rl``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence, Union

from .rl.policy import FailurePolicy
from .rl.scorer import RewardSource, plan_groups

__all__ = ["make_reward_fn", "plan_groups"]

Scorer = Callable[[Sequence[str], Sequence[Any], Sequence[Any]], list[float]]


def make_reward_fn(
    model_or_url: Union[str, os.PathLike, Any],
    *,
    on_error: Union[str, float] = "raise",
    api_key: str | None = None,
    **kwargs: Any,
) -> Scorer:
    """``fn(prompts, contexts, candidates) -> list[float]`` backed by a model or a service.

    ``model_or_url``: a ``RewardModel``, a bundle path / Hub repo id (loaded
    once per process with ``kwargs``), or an ``http(s)://`` URL of ``nvrm serve``.
    ``on_error``: ``"raise"`` (default), ``"nan"``, ``"group_mean"``, or a finite number for failed slots.
    """
    policy = FailurePolicy.parse(on_error, ("raise", "nan", "group_mean"))
    source = RewardSource(model_or_url, api_key=api_key, **kwargs)

    def fn(prompts: Sequence[str], contexts: Sequence[Any], candidates: Sequence[Any]) -> list[float]:
        results, groups = source.score(list(prompts), list(contexts), list(candidates))
        errors = {i: str(r) for i, r in enumerate(results) if isinstance(r, BaseException)}
        rewards = [None if isinstance(r, BaseException) else float(r.reward) for r in results]
        return policy.apply(rewards, groups, errors)

    return fn
