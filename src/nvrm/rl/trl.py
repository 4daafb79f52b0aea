"""TRL: a reward function for ``GRPOTrainer(reward_funcs=[...])``.

TRL 1.16 calls ``fn(prompts=, completions=, completion_ids=, **columns)`` from
``GRPOTrainer._calculate_rewards``, where ``columns`` are the dataset's other columns (TRL removes
``prompt``, ``completion`` and ``completion_ids``) plus ``trainer_state``, ``log_extra`` and
``log_metric``. A ``None`` reward is "not applicable": TRL turns it into NaN, leaves it out of the
group's mean and std, and gives the row advantage 0.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import ConfigError
from .calls import check_items, completion_as_path, guard_details, off_contract, score_call, text_of
from ..source.pinning import distinct, revisions_of
from .policy import FailurePolicy, Normalize, SignalMonitor, failure_kinds
from .render import render_all, resolve, row_of
from ..source.reward_source import RewardSource

TRL_EXTRAS = {"trainer_state", "log_extra", "log_metric", "environments"}
"""Keyword arguments TRL adds to the dataset columns."""


def trl_reward(
    model_or_url: Any,
    *,
    context_key: str = "context_video",
    render: Any = None,
    candidate_key: str | None = None,
    prompt_key: str | None = None,
    on_error: Any = "none",
    normalize: Normalize | None = None,
    short_candidates: bool = False,
    no_context: bool = False,
    api_key: str | None = None,
    name: str = "nvrm_reward",
    **load: Any,
) -> Callable[..., list[Any]]:
    """A reward function for TRL's ``GRPOTrainer``.

    Args:
        model_or_url: a ``RewardModel``, a bundle path (loaded once per process) or the URL of ``nvrm serve``.
        context_key: dataset column with each row's context video (path, bytes, ``Clip``, frames).
        render: ``render(prompt, completion, **row) -> video`` (or ``@nvrm.rl.batched``), or
            ``"module:function"``: makes the candidate from what the policy wrote. Without it (and
            without ``candidate_key``) each completion must be the path of a video file.
        candidate_key: a dataset column holding the candidate instead. The candidate then does not
            depend on the policy, so every reward of a group is equal; a warning says so.
        prompt_key: dataset column with the reward model's text prompt; default: the prompt TRL passes
            (for chat prompts, the last message's text). ``"prompt"`` means the same.
        on_error: ``"none"`` (default: TRL's "not applicable"), ``"group_mean"``, ``"nan"``, ``"raise"`` or a number.
        normalize: optional shaping (``Normalize``); off by default.
        short_candidates: opt in to scoring candidates shorter than 5 s (off-contract; see ``Contract``).
        no_context: opt in to scoring rows without a context (the column absent or None) with no context
            frames (off-contract; see ``Contract``).
        name: the name TRL logs the reward under.
        model=, revision= (URL mode): the served model's name, and the revision to pin (``nvrm.source.pinning``). The
            revision that scored each row is logged (``log_extra`` column ``NAME/revision``; ``NAME/revisions`` per step).
    """
    policy = FailurePolicy.parse(on_error, ("none", "group_mean", "nan", "raise"))
    hook = resolve(render)
    if hook is not None and candidate_key is not None:
        raise ConfigError("render= and candidate_key= both given: the candidate comes from one of them")
    source = RewardSource(model_or_url, api_key=api_key, short_candidates=short_candidates, no_context=no_context, **load)
    monitor = SignalMonitor(name, "Make the candidate from the completion: trl_reward(..., render=your_renderer).")

    def reward(prompts, completions, completion_ids=None, **kwargs) -> list[Any]:
        n = len(completions)
        if len(prompts) != n:
            raise ConfigError(f"{name}: {len(prompts)} prompts for {n} completions")
        columns = _columns(name, kwargs, n)
        texts = _prompt_texts(name, prompts, columns, prompt_key)
        if context_key not in columns and no_context:
            columns[context_key] = [None] * n
        if context_key not in columns:
            raise ConfigError(f"{name}: context_key={context_key!r} is not among the columns TRL passed ({', '.join(sorted(columns)) or 'none'})")
        cands = _candidates(name, hook, candidate_key, prompts, completions, columns)
        call = check_items(texts, columns[context_key], cands, prompt_name=f"prompt_key={prompt_key or 'prompt'}",
                           context_name=f"column {context_key!r}", no_context=no_context)
        rewards, _, errors, results = score_call(source, call, policy=policy, normalize=normalize, monitor=monitor)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric(f"{name}/failed_fraction", len(errors) / max(n, 1))
            for kind, count in failure_kinds(errors).items():
                log_metric(f"{name}/failed_{kind}", count)
            if short_candidates or no_context:
                log_metric(f"{name}/off_contract_fraction", sum(bool(r) for r in off_contract(results)) / max(n, 1))
        revisions = revisions_of(results)
        live = distinct(revisions, name)
        if callable(log_metric):
            log_metric(f"{name}/revisions", len(live))
        if callable(kwargs.get("log_extra")):
            kwargs["log_extra"](f"{name}/revision", [r or "" for r in revisions])
        reward.details = _log_both(name, source, results, kwargs.get("log_extra"), log_metric)  # type: ignore[attr-defined]
        return rewards

    reward.__name__ = name
    reward.__qualname__ = name
    return reward


def _log_both(name: str, source: RewardSource, results: list, log_extra: Any, log_metric: Any) -> dict[str, Any]:
    """Both values of a call (``guard_details``), logged as TRL columns ``NAME/raw_reward`` and ``NAME/uncertainty`` and the
    metric ``NAME/uncertainty_mean`` when the model has a guard; returned for ``reward.details``."""
    both = guard_details(results, source.conservative)
    if source.guarded:
        if callable(log_extra):
            log_extra(f"{name}/raw_reward", both["raw_reward"])
            log_extra(f"{name}/uncertainty", both["uncertainty"])
        doubts = [u for u in both["uncertainty"] if u is not None]
        if callable(log_metric) and doubts:
            log_metric(f"{name}/uncertainty_mean", sum(doubts) / len(doubts))
    return both


def _columns(name: str, kwargs: dict, n: int) -> dict[str, list]:
    """The dataset columns TRL passed (its own extras left out), each checked to have one value per completion."""
    columns = {k: list(v) for k, v in kwargs.items() if k not in TRL_EXTRAS and isinstance(v, (list, tuple))}
    for k, v in columns.items():
        if len(v) != n:
            raise ConfigError(f"{name}: column {k!r} has {len(v)} values for {n} completions")
    return columns


def _prompt_texts(name: str, prompts, columns: dict[str, list], prompt_key: str | None) -> list[Any]:
    """The reward model's prompt per row: TRL's prompt (a chat prompt's last message) or ``prompt_key``'s column."""
    if prompt_key is None or (prompt_key == "prompt" and "prompt" not in columns):
        return [text_of(p) for p in prompts]
    if prompt_key in columns:
        return [text_of(p) for p in columns[prompt_key]]
    raise ConfigError(f"{name}: prompt_key={prompt_key!r} is not among the columns TRL passed ({', '.join(sorted(columns)) or 'none'})")


def _candidates(name: str, hook, candidate_key: str | None, prompts, completions, columns: dict[str, list]) -> list[Any]:
    """Each row's candidate: rendered from the completion, a column, or the completion as a video path."""
    n = len(completions)
    rows = [{k: v[i] for k, v in columns.items()} for i in range(n)]
    if hook is not None:
        return render_all(hook, list(prompts), [text_of(c) for c in completions], [row_of(r) for r in rows])
    if candidate_key is not None:
        if candidate_key not in columns:
            raise ConfigError(f"{name}: candidate_key={candidate_key!r} is not among the columns TRL passed ({', '.join(sorted(columns)) or 'none'})")
        return columns[candidate_key]
    cands = [completion_as_path(c, i) for i, c in enumerate(completions)]
    if n and all(isinstance(c, BaseException) for c in cands):
        raise ConfigError(f"{name}: no completion is a video path ({cands[0]}); the policy writes text, so pass render= to make videos from it")
    return cands
