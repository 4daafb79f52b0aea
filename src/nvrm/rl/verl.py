"""verl: custom reward functions that verl's loader finds by name, configured from ``reward_kwargs``.

verl (0.9) loads ``reward.custom_reward_function.path`` as a module *by file path* and takes
``getattr(module, name)``; ``reward_kwargs`` reach every call as keyword arguments. So this file
uses absolute imports only, and every setting arrives in the call:

    reward:
      num_workers: 1                               # in-process: each reward worker (a Ray actor) loads a model
      reward_manager: {source: register, name: naive}
      custom_reward_function:
        path: pkg://nvrm.rl.verl                   # or this file's path
        name: compute_score
        reward_kwargs:
          model: http://127.0.0.1:8000              # or a bundle path (in-process)
          render: my_project.render:render_video   # what the policy wrote -> the candidate video
          on_error: raise                          # or group_mean, or a number
          # model_name: mine   revision: <sha256>  # URL mode: which served model, pinned (nvrm.source.pinning)

- ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **settings) -> dict``:
  per sample, for verl 0.9's reward loop (its managers: naive, dapo, gdpo, remote, rate_limited; it
  has no batch manager). The loop calls it for many samples at once from worker threads; calls that
  arrive within ``coalesce_ms`` are scored together, so a group still shares one prefix prefill.
- ``compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **settings) -> list[dict]``:
  for verl's legacy ``verl.workers.reward_manager.BatchRewardManager``, which 0.9's trainer no longer
  builds from a config but which code can still construct (``BatchRewardManager(tokenizer, 0,
  compute_score_batch, ...)``). It passes numpy object arrays; every column must have one entry per sample.
- Each sample's ``extra_info`` carries its prompt (``prompt_key``) and context (``context_key``);
  a missing one is an error naming the key, never an empty prompt.
- One model per process, however many reward managers verl builds (``nvrm.source.reward_source.shared_model``).
- Failures: ``on_error="raise"`` (default) raises ``RewardFnError``. If verl calls again with the
  same batch after that error, the error is raised again at once, without scoring twice.
  ``on_error=<number>`` or ``"group_mean"`` fills the score and reports ``nvrm_ok: 0.0``.
- Every setting is used or refused: an unknown key in ``reward_kwargs`` is a ``ConfigError``.

In process (``model:`` a bundle path) nvrm runs on verl's transformers 5 with the release's rewards
(the README's version table). URL mode (``model: http://...`` against ``nvrm serve``) needs only the
``nvrm-client`` distribution (``client/``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nvrm.rl.calls import refuse_unknown
from nvrm.rl.verl_scorer import LOAD_KEYS, VERL_EXTRAS, VerlScorer, VerlSettings, scorer_for
from nvrm.errors import ConfigError


def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None, **settings) -> dict:
    """verl's per-sample custom reward (NaiveRewardManager and the reward loop); settings from ``reward_kwargs``."""
    return scorer_for(settings).single((data_source, solution_str, ground_truth, extra_info))


def compute_score_batch(data_sources=None, solution_strs=None, ground_truths=None, extra_infos=None, **settings) -> list[dict]:
    """verl's ``BatchRewardManager`` custom reward (any sequences: verl passes numpy object arrays); settings
    from ``reward_kwargs``."""
    return scorer_for(settings).batch(batch_items(data_sources, solution_strs, ground_truths, extra_infos, "compute_score_batch"))


def batch_items(data_sources, solution_strs, ground_truths, extra_infos, where: str) -> list[tuple]:
    """(data_source, solution_str, ground_truth, extra_info) per sample from verl's columns: lists, tuples or
    numpy object arrays; a column left out is None for every sample; columns of different lengths are refused."""
    if solution_strs is None:
        raise ConfigError(f"{where}: no solution_strs")
    solutions = list(solution_strs)
    n = len(solutions)
    columns = {"data_sources": data_sources, "ground_truths": ground_truths, "extra_infos": extra_infos}
    cols = {k: [None] * n if v is None else list(v) for k, v in columns.items()}
    bad = {k: len(v) for k, v in cols.items() if len(v) != n}
    if bad:
        got = ", ".join(f"{v} {k}" for k, v in bad.items())
        raise ConfigError(f"{where}: {n} solution_strs but {got}; every column needs one entry per sample")
    return list(zip(cols["data_sources"], solutions, cols["ground_truths"], cols["extra_infos"]))


compute_score.batch = compute_score_batch  # type: ignore[attr-defined]


def verl_compute_score(model_or_url: Any, **settings: Any):
    """``compute_score`` bound to a model (a ``RewardModel``, a bundle path or a URL) and settings, for use in
    Python (``compute_score.batch`` for the batch signature). In a verl YAML config, point
    ``custom_reward_function`` at this file instead and put the settings in ``reward_kwargs``."""
    if not isinstance(model_or_url, str):
        refuse_unknown(settings, {f.name for f in dataclasses.fields(VerlSettings)} - {"model", "load"} | LOAD_KEYS, "verl_compute_score")
        fields = {k: v for k, v in settings.items() if k not in LOAD_KEYS}
        scorer = VerlScorer(VerlSettings(model=model_or_url, **fields))  # an in-process RewardModel
    else:
        scorer = scorer_for({"model": model_or_url, **settings})

    def fn(data_source=None, solution_str=None, ground_truth=None, extra_info=None, **kwargs) -> dict:
        refuse_unknown(kwargs, VERL_EXTRAS, "compute_score")
        return scorer.single((data_source, solution_str, ground_truth, extra_info))

    def batch(data_sources=None, solution_strs=None, ground_truths=None, extra_infos=None, **kwargs) -> list[dict]:
        refuse_unknown(kwargs, VERL_EXTRAS, "compute_score.batch")
        return scorer.batch(batch_items(data_sources, solution_strs, ground_truths, extra_infos, "compute_score.batch"))

    fn.batch = batch  # type: ignore[attr-defined]
    return fn
