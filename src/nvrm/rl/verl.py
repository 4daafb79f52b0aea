"""verl: custom reward functions that verl's loader finds by name, configured from ``reward_kwargs``.

verl (0.9) loads ``reward.custom_reward_function.path`` as a module *by file path* and takes
``getattr(module, name)``; ``reward_kwargs`` reach every call as keyword arguments. So this file
uses absolute imports only, and every setting arrives in the call:

    reward:
      custom_reward_function:
        path: <site-packages>/nvrm/rl/verl.py      # python -c "import nvrm.rl.verl as m; print(m.__file__)"
        name: compute_score_batch                  # BatchRewardManager; compute_score for per-sample managers
        reward_kwargs:
          model: http://127.0.0.1:8000              # or a bundle path (in-process)
          render: my_project.render:render_video   # what the policy wrote -> the candidate video
          on_error: raise                          # or group_mean, or a number

- ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **settings) -> dict``:
  per sample. verl's reward loop calls it for many samples at once from worker threads; calls that
  arrive within ``coalesce_ms`` are scored together, so a group still shares one prefix prefill.
- ``compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **settings) -> list[dict]``.
- Each sample's ``extra_info`` carries its prompt (``prompt_key``) and context (``context_key``);
  a missing one is an error naming the key, never an empty prompt.
- One model per process, however many reward managers verl builds (``nvrm.rl.scorer.shared_model``).
- Failures: ``on_error="raise"`` (default) raises ``RewardFnError``. If verl calls again with the
  same batch after that error, the error is raised again at once, without scoring twice.
  ``on_error=<number>`` or ``"group_mean"`` fills the score and reports ``nvrm_ok: 0.0``.
- Every setting is used or refused: an unknown key in ``reward_kwargs`` is a ``ConfigError``.

verl 0.9 needs transformers 5, while the runtime runs on the release profile (transformers
4.57.6): in a verl process use URL mode (``model: http://...`` against ``nvrm serve`` started from
nvrm's own environment). The URL path needs only the ``nvrm-client`` distribution (``client/``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nvrm.rl.calls import refuse_unknown
from nvrm.rl.verl_scorer import _LOAD_KEYS, VERL_EXTRAS, VerlScorer, VerlSettings, scorer_for
from nvrm.errors import ConfigError


def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None, **settings) -> dict:
    """verl's per-sample custom reward (NaiveRewardManager and the reward loop); settings from ``reward_kwargs``."""
    return scorer_for(settings).single((data_source, solution_str, ground_truth, extra_info))


def compute_score_batch(data_sources=None, solution_strs=None, ground_truths=None, extra_infos=None, **settings) -> list[dict]:
    """verl's ``BatchRewardManager`` custom reward; settings from ``reward_kwargs``."""
    n = len(solution_strs or [])
    sources = list(data_sources or [None] * n)
    truths = list(ground_truths or [None] * n)
    infos = list(extra_infos or [None] * n)
    if not (len(sources) == len(truths) == len(infos) == n):
        raise ConfigError(f"compute_score_batch: {len(sources)} data_sources, {n} solution_strs, {len(truths)} ground_truths, {len(infos)} extra_infos")
    return scorer_for(settings).batch(list(zip(sources, solution_strs, truths, infos)))


compute_score.batch = compute_score_batch  # type: ignore[attr-defined]


def verl_compute_score(model_or_url: Any, **settings: Any):
    """``compute_score`` bound to a model (a ``RewardModel``, a bundle path or a URL) and settings, for use in
    Python (``compute_score.batch`` for the batch signature). In a verl YAML config, point
    ``custom_reward_function`` at this file instead and put the settings in ``reward_kwargs``."""
    if not isinstance(model_or_url, str):
        refuse_unknown(settings, {f.name for f in dataclasses.fields(VerlSettings)} - {"model", "load"} | _LOAD_KEYS, "verl_compute_score")
        fields = {k: v for k, v in settings.items() if k not in _LOAD_KEYS}
        scorer = VerlScorer(VerlSettings(model=model_or_url, **fields))  # an in-process RewardModel
    else:
        scorer = scorer_for({"model": model_or_url, **settings})

    def fn(data_source=None, solution_str=None, ground_truth=None, extra_info=None, **kwargs) -> dict:
        refuse_unknown(kwargs, VERL_EXTRAS, "compute_score")
        return scorer.single((data_source, solution_str, ground_truth, extra_info))

    def batch(data_sources=None, solution_strs=None, ground_truths=None, extra_infos=None, **kwargs) -> list[dict]:
        refuse_unknown(kwargs, VERL_EXTRAS, "compute_score.batch")
        n = len(solution_strs)
        return scorer.batch(list(zip(data_sources or [None] * n, solution_strs, ground_truths or [None] * n, extra_infos or [None] * n)))

    fn.batch = batch  # type: ignore[attr-defined]
    return fn
