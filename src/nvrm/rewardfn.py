"""``make_reward_fn``: the reward as a plain function for RL loops.

    fn = nvrm.make_reward_fn("artifacts/WORL-NVRM")          # in-process
    fn = nvrm.make_reward_fn("http://127.0.0.1:8000")        # a running nvrm serve
    rewards = fn(prompts, contexts, candidates)               # list[float], in order

Items that share a prompt and context (a GRPO group) are scored together with
shared-context reuse. A failed item raises ``RewardFnError`` naming every
failed index; ``on_error="nan"`` (or a number) fills failed slots instead, on
request only, never silently.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any, Callable, Sequence, Union

from .errors import NvrmError, RewardFnError
from .clip import Clip


def _context_key(prompt: str, context: Any):
    if isinstance(context, (str, os.PathLike)):
        return (prompt, "path", os.path.abspath(os.fspath(context)))
    if isinstance(context, (bytes, bytearray, memoryview)):
        return (prompt, "bytes", hashlib.sha256(bytes(context)).hexdigest())
    if isinstance(context, Clip):
        return (prompt, "obj", id(context))
    return None


def plan_groups(prompts: Sequence[str], contexts: Sequence[Any]) -> list[list[int]]:
    """Indices grouped by identical (prompt, context), first-seen order; unkeyable items alone (pure)."""
    groups: dict[Any, list[int]] = {}
    order: list[list[int]] = []
    for i, (p, c) in enumerate(zip(prompts, contexts)):
        key = _context_key(p, c)
        if key is None:
            order.append([i])
            continue
        if key not in groups:
            groups[key] = []
            order.append(groups[key])
        groups[key].append(i)
    return order


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
    here with ``kwargs``), or an ``http(s)://`` URL of ``nvrm serve``.
    ``on_error``: ``"raise"`` (default), ``"nan"``, or a float to put in failed slots.
    """
    if not (on_error in ("raise", "nan") or (isinstance(on_error, (int, float)) and not isinstance(on_error, bool))):
        raise ValueError(f"on_error must be 'raise', 'nan' or a number, got {on_error!r}")
    if isinstance(model_or_url, str) and model_or_url.startswith(("http://", "https://")):
        from .client import RewardClient

        client = RewardClient(model_or_url, api_key=api_key, **kwargs)

        def groups_fn(groups):
            for p, c, cands in groups:
                try:
                    yield client.score_group(p, c, cands, errors="return")
                except NvrmError as e:  # the whole request failed: every slot says why
                    yield [e] * len(cands)

        batch_fn = lambda items: client.score_batch(items, errors="return")  # noqa: E731
    else:
        model = model_or_url
        if not hasattr(model, "score_group"):
            from .scoring import RewardModel

            model = RewardModel.from_pretrained(model_or_url, **kwargs)
        groups_fn = lambda groups: model.score_groups(groups, errors="return")  # noqa: E731
        batch_fn = lambda items: model.score_batch(items, errors="return")  # noqa: E731

    def fn(prompts: Sequence[str], contexts: Sequence[Any], candidates: Sequence[Any]) -> list[float]:
        if not (len(prompts) == len(contexts) == len(candidates)):
            raise ValueError(f"prompts, contexts and candidates differ in length ({len(prompts)}, {len(contexts)}, {len(candidates)})")
        results: list[Any] = [None] * len(prompts)
        plan = plan_groups(prompts, contexts)
        groups = [idx for idx in plan if len(idx) > 1]
        singles = [idx[0] for idx in plan if len(idx) == 1]
        # groups stream through the model: the next groups are prepared while one is scored
        stream = ((prompts[idx[0]], contexts[idx[0]], [candidates[i] for i in idx]) for idx in groups)
        for idx, out in zip(groups, groups_fn(stream)):
            for i, r in zip(idx, out):
                results[i] = r
        if singles:
            out = batch_fn([(prompts[i], contexts[i], candidates[i]) for i in singles])
            for i, r in zip(singles, out):
                results[i] = r
        failures = {i: str(r) for i, r in enumerate(results) if isinstance(r, BaseException)}
        if failures and on_error == "raise":
            raise RewardFnError(failures, len(results))
        fill = math.nan if on_error in ("nan", "raise") else float(on_error)  # "raise" never reaches a fill
        return [fill if isinstance(r, BaseException) else float(r.reward) for r in results]

    return fn
