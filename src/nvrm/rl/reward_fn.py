"""``make_reward_fn``: the reward as a plain function for RL loops.

    fn = nvrm.make_reward_fn("artifacts/WORL-NVRM")          # in-process
    fn = nvrm.make_reward_fn("http://127.0.0.1:8000")        # a running nvrm serve
    rewards = fn(prompts, contexts, candidates)               # list[float], in order

Items that share a prompt and context (a GRPO group) are scored together with
shared-context reuse. A failed item raises ``RewardFnError`` naming every
failed index; ``on_error="nan"``, ``"group_mean"`` or a number fills failed
slots instead, on request only, never silently. It is the RL adapters' own
path (``nvrm.rl.calls.score_call``): the same checks, grouping and failure
policies.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence, Union

from .calls import check_items, guard_details, score_call
from .policy import FailurePolicy
from ..source.reward_source import RewardSource, group_items

__all__ = ["make_reward_fn", "group_items"]

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
    ``conservative=λ`` (a keyword of ``kwargs``): the rewards are ``reward - λ * uncertainty`` (the model needs a guard);
    after each call ``fn.details`` holds both values (``raw_reward``, ``uncertainty``, ``conservative``).
    """
    policy = FailurePolicy.parse(on_error, ("raise", "nan", "group_mean"))
    source = RewardSource(model_or_url, api_key=api_key, **kwargs)

    def fn(prompts: Sequence[str], contexts: Sequence[Any], candidates: Sequence[Any]) -> list[float]:
        if not (len(prompts) == len(contexts) == len(candidates)):
            from ..errors import ConfigError

            raise ConfigError(f"prompts, contexts and candidates differ in length ({len(prompts)}, {len(contexts)}, {len(candidates)})")
        call = check_items(prompts, contexts, candidates, prompt_name="prompts[i]", context_name="contexts[i]")
        rewards, _, _, results = score_call(source, call, policy=policy, normalize=None, monitor=None)
        fn.details = guard_details(results, source.conservative)  # type: ignore[attr-defined]
        return rewards

    fn.details = {}  # type: ignore[attr-defined]
    return fn
