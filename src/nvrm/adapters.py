"""Drop-in reward functions for the RL trainers video and world-model people run.

Each adapter has its trainer's own call signature, works over an in-process
model (a ``RewardModel``, or a bundle path it loads) or a running
``nvrm serve`` (an ``http(s)://`` URL), scores a call's candidates in groups of
shared (prompt, context) with prefix reuse, and reports failed items in the
trainer's own way, never as a silent 0.0:

- ``trl_reward(...)``: TRL's ``GRPOTrainer(reward_funcs=...)``:
  ``fn(prompts, completions, completion_ids=None, **columns) -> list[float | None]``.
  A failed item is ``None``, which TRL documents as "reward not applicable":
  it drops out of the reward sum (from TRL 1.13 a row no function could score
  gets advantage 0). The context comes from a dataset column
  (``context_key``); the candidate from a column (``candidate_key``) or the
  completion text (a path).
- ``verl_compute_score(...)``: verl's custom reward function,
  ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw)
  -> {"score": float, "nvrm_ok": 1.0}``, one sample per call, plus ``.batch``
  with the ``BatchRewardManager`` keywords. verl cannot take ``None``, so a
  failure raises ``RewardFnError`` (the default), or with ``on_error=<float>``
  returns that score with ``nvrm_ok: 0.0`` so the failure shows in verl's
  reward metrics.
- ``flow_grpo_reward(...)``: a flow-GRPO reward factory,
  ``factory(device) -> fn(videos, prompts, metadata, **kw) -> (scores, info)``
  with ``videos`` a ``[B, T, C, H, W]`` float tensor in [0, 1] (or uint8
  ``[B, T, H, W, C]`` arrays, or paths). flow-GRPO has no missing-value
  convention, so a failure raises (default) or fills ``on_error`` and lists
  the failed indices in ``info["nvrm_failed"]``.

Normalisation for RL (``Normalize``) is off by default: the raw reward is the
contract's. When asked for, it whitens within each group (z-score), or by a
running mean and std, and/or clips; failed items stay failed.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union

from .errors import ConfigError, NvrmError, RewardFnError
from .rewardfn import plan_groups

ModelOrUrl = Union[str, os.PathLike, Any]


@dataclass
class RunningStats:
    """Mean and variance over everything seen (Welford), safe to share between threads."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def update(self, values: Sequence[float]) -> None:
        with self._lock:
            for v in values:
                self.n += 1
                d = v - self.mean
                self.mean += d / self.n
                self.m2 += d * (v - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n > 1 else 0.0


@dataclass(frozen=True)
class Normalize:
    """Optional reward shaping for RL; the default changes nothing."""

    group_whiten: bool = False
    """z-score within each group of shared (prompt, context): (r - mean) / (std + eps)."""
    running: bool = False
    """z-score by the running mean and std of every reward seen so far (applied before clipping)."""
    clip: float | None = None
    """Clip the (shaped) reward to [-clip, clip]."""
    eps: float = 1e-6
    stats: RunningStats = field(default_factory=RunningStats, compare=False)

    @property
    def active(self) -> bool:
        return self.group_whiten or self.running or self.clip is not None

    def __call__(self, rewards: list[float | None], groups: Sequence[Sequence[int]]) -> list[float | None]:
        """Shaped rewards; ``None`` (failed) entries stay ``None``."""
        out = list(rewards)
        if self.group_whiten:
            for idx in groups:
                vals = [out[i] for i in idx if out[i] is not None]
                if len(vals) < 2:
                    continue
                mean = sum(vals) / len(vals)
                std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
                for i in idx:
                    if out[i] is not None:
                        out[i] = (out[i] - mean) / (std + self.eps)  # type: ignore[operator]
        if self.running:
            good = [v for v in out if v is not None]
            self.stats.update(good)
            out = [None if v is None else (v - self.stats.mean) / (self.stats.std + self.eps) for v in out]
        if self.clip is not None:
            c = float(self.clip)
            out = [None if v is None else max(-c, min(c, v)) for v in out]
        return out


class GroupScorer:
    """Scores (prompt, context, candidate) items, grouped by shared (prompt, context)."""

    def __init__(self, model_or_url: ModelOrUrl, *, api_key: str | None = None, **load: Any):
        self.client = None
        self.model = None
        if isinstance(model_or_url, str) and model_or_url.startswith(("http://", "https://")):
            from .client import RewardClient

            self.client = RewardClient(model_or_url, api_key=api_key, **load)
        elif hasattr(model_or_url, "score_groups"):
            self.model = model_or_url
        else:
            from .scoring import RewardModel

            self.model = RewardModel.from_pretrained(model_or_url, **load)

    def __call__(self, prompts: Sequence[str], contexts: Sequence[Any], candidates: Sequence[Any]) -> tuple[list[Any], list[list[int]]]:
        """(per item: ScoreResult or NvrmError, the groups used)."""
        groups = plan_groups(prompts, contexts)
        results: list[Any] = [None] * len(prompts)
        stream = [(prompts[g[0]], contexts[g[0]], [candidates[i] for i in g]) for g in groups]
        if self.model is not None:
            outs = self.model.score_groups(stream, errors="return")
        else:
            outs = (self._remote(*g) for g in stream)
        for idx, out in zip(groups, outs):
            for i, r in zip(idx, out):
                results[i] = r
        return results, groups

    def _remote(self, prompt: str, context: Any, candidates: list[Any]) -> list[Any]:
        try:
            return self.client.score_group(prompt, context, candidates, errors="return")  # type: ignore[union-attr]
        except NvrmError as e:  # the request as a whole failed: every slot says why
            return [e] * len(candidates)


def _check_on_error(on_error: Any) -> None:
    if not (on_error == "raise" or isinstance(on_error, (int, float)) and not isinstance(on_error, bool)):
        raise ConfigError(f"on_error={on_error!r}: must be 'raise' or a number (the score a failed item gets)")


def _column(kwargs: dict, key: str, n: int) -> list:
    """A dataset column TRL passed through; a missing one fails every item with its name."""
    if key not in kwargs:
        raise RewardFnError({i: f"the dataset has no {key!r} column" for i in range(n)}, n)
    return list(kwargs[key])


def _text(value: Any) -> Any:
    """A prompt or completion as TRL passes it: a string, or chat messages (take the last message's text)."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        content = value[-1].get("content")
        if isinstance(content, list):  # multimodal content items
            texts = [c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text"]
            return "".join(texts)
        return content
    return value


def _candidate(value: Any) -> Any:
    value = _text(value)
    return value.strip() if isinstance(value, str) else value


def trl_reward(
    model_or_url: ModelOrUrl,
    *,
    context_key: str = "context_video",
    candidate_key: str | None = None,
    prompt_key: str | None = None,
    normalize: Normalize | None = None,
    api_key: str | None = None,
    name: str = "nvrm_reward",
    **load: Any,
) -> Callable[..., list[float | None]]:
    """A reward function for TRL's ``GRPOTrainer(reward_funcs=[...])``.

    Args:
        model_or_url: a ``RewardModel``, a bundle path, or the URL of ``nvrm serve``.
        context_key: dataset column with each row's context video (path, bytes or ``Clip``).
        candidate_key: dataset column with the candidate video; default: the completion text is its path.
        prompt_key: dataset column with the text prompt for the reward model; default: TRL's ``prompts``
            (for chat prompts, the last message's text).
        normalize: optional shaping (``Normalize``); off by default.
        name: the name TRL logs the reward under.

    Returns:
        ``fn(prompts, completions, completion_ids=None, **columns) -> list[float | None]``; ``None``
        marks an item that could not be scored (TRL leaves it out of the reward sum).
    """
    scorer = GroupScorer(model_or_url, api_key=api_key, **load)
    shape = normalize or Normalize()

    def reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]:
        n = len(completions)
        contexts = _column(kwargs, context_key, n)
        texts = _column(kwargs, prompt_key, n) if prompt_key else [_text(p) for p in prompts]
        cands = _column(kwargs, candidate_key, n) if candidate_key else [_candidate(c) for c in completions]
        results, groups = scorer(texts, contexts, cands)
        rewards: list[float | None] = [None if isinstance(r, BaseException) else float(r.reward) for r in results]
        failed = sum(r is None for r in rewards)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric(f"{name}/failed_fraction", failed / max(n, 1))
        return shape(rewards, groups) if shape.active else rewards

    reward.__name__ = name
    reward.__qualname__ = name
    return reward


def verl_compute_score(
    model_or_url: ModelOrUrl,
    *,
    context_key: str = "context_video",
    candidate_key: str | None = "candidate_video",
    prompt_key: str = "prompt",
    on_error: "str | float" = "raise",
    normalize: Normalize | None = None,
    api_key: str | None = None,
    **load: Any,
):
    """verl's custom reward function (``reward.custom_reward_function``) over nvrm.

    Each sample's ``extra_info`` carries ``prompt_key``, ``context_key`` and (unless
    ``candidate_key`` is None, in which case ``solution_str`` is the candidate's path)
    ``candidate_key``. ``on_error``: ``"raise"`` (default; verl stops the step with the
    message) or a float score returned with ``nvrm_ok: 0.0``.

    Returns:
        ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw) -> dict``, with
        ``compute_score.batch(data_sources, solution_strs, ground_truths, extra_infos, **kw) -> list[dict]``
        for verl's ``BatchRewardManager`` (groups shared contexts across the batch).
    """
    _check_on_error(on_error)
    scorer = GroupScorer(model_or_url, api_key=api_key, **load)
    shape = normalize or Normalize()

    def batch(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list[dict[str, float]]:
        infos = [info or {} for info in extra_infos]
        prompts = [info.get(prompt_key, "") for info in infos]
        contexts = [info.get(context_key) for info in infos]
        cands = [info.get(candidate_key) for info in infos] if candidate_key else [s.strip() for s in solution_strs]
        results, groups = scorer(prompts, contexts, cands)
        failures = {i: str(r) for i, r in enumerate(results) if isinstance(r, BaseException)}
        if failures and on_error == "raise":
            raise RewardFnError(failures, len(results))
        rewards = shape([None if isinstance(r, BaseException) else float(r.reward) for r in results], groups)
        return [
            {"score": float(on_error) if r is None else r, "nvrm_ok": 0.0 if r is None else 1.0}  # type: ignore[arg-type]
            for r in rewards
        ]

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict[str, float]:
        return batch([data_source], [solution_str], [ground_truth], [extra_info], **kwargs)[0]

    compute_score.batch = batch  # type: ignore[attr-defined]
    return compute_score


def frames_of(video: Any) -> Any:
    """One flow-GRPO video as uint8 ``(T, H, W, 3)`` frames: a ``[T, C, H, W]`` float tensor in [0, 1]
    (converted as diffusers does: ``(x * 255).round()``), a uint8 ``(T, H, W, 3)`` array, or a path."""
    if isinstance(video, (str, os.PathLike, bytes)):
        return video
    if hasattr(video, "detach"):
        import torch

        v = video.detach()
        if v.dtype.is_floating_point:
            v = (v.clamp(0, 1) * 255).round().to(torch.uint8)
        if v.ndim == 4 and v.shape[1] in (1, 3) and v.shape[-1] not in (1, 3):
            v = v.permute(0, 2, 3, 1)
        return v.cpu().numpy()
    return video


def flow_grpo_reward(
    model_or_url: ModelOrUrl,
    *,
    context_key: str = "context_video",
    fps_key: str = "fps",
    fps: float = 16.0,
    on_error: "str | float" = "raise",
    normalize: Normalize | None = None,
    api_key: str | None = None,
    **load: Any,
):
    """A flow-GRPO reward factory (register it in flow-GRPO's ``score_functions``).

    ``metadata[i][context_key]`` gives each sample's context, ``metadata[i][fps_key]``
    (default ``fps``) the frame rate of the generated videos.

    Returns:
        ``factory(device=None) -> fn(videos, prompts, metadata, **kw) -> (scores, info)`` where
        ``info["nvrm_failed"]`` lists failed indices (filled with ``on_error`` when it is a number).
        A bundle path is loaded once, on the first call, on ``device`` (unless ``device=`` was given
        here); a ``RewardModel`` or a URL is used as it is.
    """
    _check_on_error(on_error)
    from .clip import Clip

    shape = normalize or Normalize()
    state: dict[str, GroupScorer] = {}

    def factory(device: Any = None):
        if "scorer" not in state:
            local = not (isinstance(model_or_url, str) and model_or_url.startswith(("http://", "https://")))
            extra = {"device": str(device)} if device is not None and local and "device" not in load else {}
            state["scorer"] = GroupScorer(model_or_url, api_key=api_key, **load, **extra)
        scorer = state["scorer"]

        def fn(videos, prompts, metadata, **kwargs):
            metas = [m or {} for m in metadata]
            cands = []
            for v, m in zip(videos, metas):
                f = frames_of(v)
                cands.append(Clip(f, float(m.get(fps_key, fps)), name="generated video") if not isinstance(f, (str, os.PathLike, bytes)) else f)
            results, groups = scorer(list(prompts), [m.get(context_key) for m in metas], cands)
            failures = {i: str(r) for i, r in enumerate(results) if isinstance(r, BaseException)}
            if failures and on_error == "raise":
                raise RewardFnError(failures, len(results))
            rewards = shape([None if isinstance(r, BaseException) else float(r.reward) for r in results], groups)
            scores = [float(on_error) if r is None else r for r in rewards]  # type: ignore[arg-type]
            return scores, {"nvrm_failed": sorted(failures), "nvrm_errors": [failures.get(i) for i in range(len(results))]}

        return fn

    return factory
