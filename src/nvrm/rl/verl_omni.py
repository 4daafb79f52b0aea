"""verl-omni: ``compute_score(data_source, solution_image, ground_truth, extra_info, **settings)``.

verl-omni's ``VisualRewardManager`` (and each entry of ``MultiVisualRewardManager``) calls the custom
reward once per sample, from executor threads, with ``solution_image`` the rollout as uint8 pixels
(one video: ``[T, C, H, W]`` or ``[C, T, H, W]``; ``layout: auto`` tells them apart) and the settings
from the config (``reward_kwargs``, or the multi manager's extra entry fields):

    reward:
      custom_reward_function:
        path: pkg://nvrm.rl.verl_omni            # or this file's path (absolute imports only)
        name: compute_score
        reward_kwargs: {model: http://127.0.0.1:8000, context_key: context_video, fps: 24}

- The prompt is ``ground_truth`` (verl-omni's video datasets put the prompt there) unless
  ``prompt_key`` names an ``extra_info`` key; the context comes from ``extra_info[context_key]``, the
  rollout's leading ``context_frames``, or ``context`` (one fixed path); a missing one is an error.
- Samples of one step that arrive together are scored as one batch (``coalesce_ms``); those sharing
  a prompt and context are one group with one prefill.
- Returns ``{"score": reward, "nvrm_ok": 1.0, "nvrm_off_contract": 0.0 | 1.0}``. A failed sample raises
  ``RewardFnError``: the multi manager then counts the entry as 0.0 (``required: true`` stops the
  step instead, the safer choice: 0.0 is a possible NVRM reward); ``on_error=<number>`` or
  ``"group_mean"`` fills it and reports ``nvrm_ok: 0.0``.
- A still image (``[C, H, W]``) or a float latent (``output_type: latent``) is refused with the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nvrm.errors import ConfigError, InputError, RewardFnError
from nvrm.rl.calls import guard_columns, off_contract, refuse_unknown, score_call, video_of
from nvrm.rl.context_rule import ContextRule, build_call, frames_of
from nvrm.rl.policy import FailurePolicy, SignalMonitor
from nvrm.source.reward_source import RewardSource, group_items, registry
from nvrm.rl.verl_scorer import LOAD_KEYS, Batcher

OMNI_EXTRAS = {"reward_router_address", "reward_model_tokenizer", "model_name"}
"""Keyword arguments verl-omni's reward managers add to a call; not settings, so not used."""


@dataclasses.dataclass(frozen=True)
class OmniSettings:
    """What ``reward_kwargs`` (or a multi-manager entry) may hold."""

    model: Any
    """The URL of nvrm serve, a bundle path, or (from Python) a RewardModel."""
    fps: float = 16.0
    """Frame rate of the rollouts (``extra_info[fps_key]`` overrides it per sample)."""
    fps_key: str = "fps"
    prompt_key: str | None = None
    """``extra_info`` key of the prompt; None: the prompt is ``ground_truth``."""
    context: Any = None
    context_key: str | None = None
    context_frames: int = 0
    no_context: bool = False
    layout: str = "auto"
    on_error: Any = "raise"
    short_candidates: bool = False
    coalesce_ms: float = 20.0
    api_key: str | None = None
    load: tuple = ()

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> "OmniSettings":
        """Settings from a call's keyword arguments; an unknown key is refused, verl-omni's own are dropped."""
        names = {f.name for f in dataclasses.fields(cls)} - {"load"}
        refuse_unknown(kwargs, names | LOAD_KEYS | OMNI_EXTRAS, "verl-omni reward_kwargs")
        if "model" not in kwargs:
            raise ConfigError("verl-omni reward_kwargs: no 'model'; give the URL of nvrm serve (or a bundle path to load in process)")
        given = {k: v for k, v in kwargs.items() if k in names}
        return cls(**given, load=tuple(sorted((k, v) for k, v in kwargs.items() if k in LOAD_KEYS)))


def _floating(dtype: Any) -> bool:
    """Whether ``dtype`` (a torch or NumPy dtype) holds floats (or complex numbers): one rule for both, since verl-omni's
    pixels are uint8 and a float rollout is a latent or unscaled output, never frames."""
    if dtype is None:
        return False
    torch_float = getattr(dtype, "is_floating_point", None)
    if isinstance(torch_float, bool):
        return torch_float or bool(getattr(dtype, "is_complex", False))
    return getattr(dtype, "kind", "") in ("f", "c")


class OmniScorer:
    """One per distinct settings per process: coalesces verl-omni's per-sample calls into batches."""

    def __init__(self, settings: OmniSettings):
        s = self.settings = settings
        self.rule = ContextRule(context=s.context, context_key=s.context_key, context_frames=s.context_frames, no_context=s.no_context)
        frames_of(None, s.layout, "verl-omni reward_kwargs layout")
        self.policy = FailurePolicy.parse(s.on_error, ("raise", "group_mean"), where="verl-omni reward_kwargs on_error")
        self.source = RewardSource(s.model, api_key=s.api_key, short_candidates=s.short_candidates, no_context=s.no_context, **dict(s.load))
        self.monitor = SignalMonitor("nvrm verl-omni reward", "Check that each prompt's rollouts really differ.")
        self.batcher = Batcher(self._outcomes, s.coalesce_ms / 1000.0)

    def _candidate(self, solution: Any, info: dict, i: int) -> Any:
        where = f"solution_image {i}"
        if _floating(getattr(solution, "dtype", None)):
            return InputError(where, "is a float tensor or array (output_type: latent?); nvrm scores uint8 pixels: "
                                     "set the rollout's output_type to pixels")
        v = frames_of(solution, self.settings.layout, where)
        return v if isinstance(v, BaseException) else video_of(v, info.get(self.settings.fps_key, self.settings.fps), where)

    def _outcomes(self, items: list[tuple]) -> list[Any]:
        """One dict or one ``RewardFnError`` per sample."""
        s = self.settings
        infos = [info if isinstance(info, dict) else {} for _, _, _, info in items]
        prompts = [gt if s.prompt_key is None else info.get(s.prompt_key) for (_, _, gt, _), info in zip(items, infos)]
        cands = [self._candidate(sol, info, i) for i, ((_, sol, _, _), info) in enumerate(zip(items, infos))]
        prompt_name = "ground_truth" if s.prompt_key is None else f"extra_info[{s.prompt_key!r}]"
        call = build_call(self.rule, prompts, infos, cands, prompt_name=prompt_name)
        rewards, _, errors, results = score_call(self.source, call, policy=FailurePolicy("none"), normalize=None, monitor=self.monitor)
        if errors and self.policy.mode != "raise":
            rewards = self.policy.apply(rewards, group_items(call.prompts, call.contexts), errors)
        flags = off_contract(results)
        both = guard_columns(self.source, results)
        return [RewardFnError({i: errors[i]}, len(items)) if r is None
                else {"score": float(r), "nvrm_ok": 0.0 if i in errors else 1.0, "nvrm_off_contract": 1.0 if flags[i] else 0.0,
                      **{k: v[i] for k, v in both.items()}}
                for i, r in enumerate(rewards)]

    def single(self, item: tuple) -> dict:
        """One sample's result, scored in a batch with the samples that arrive with it."""
        return self.batcher.submit(item)


def compute_score(data_source=None, solution_image=None, ground_truth=None, extra_info=None, **settings) -> dict:
    """verl-omni's custom visual reward (one sample); settings from ``reward_kwargs``."""
    for name in OMNI_EXTRAS:
        settings.pop(name, None)
    return scorer_for(settings).single((data_source, solution_image, ground_truth, extra_info))


def scorer_for(kwargs: dict) -> OmniScorer:
    """The process's scorer for these settings (built once)."""
    settings = OmniSettings.from_kwargs(kwargs)
    return registry(("verl-omni", repr(settings)), lambda: OmniScorer(settings))


def verl_omni_compute_score(model_or_url: Any, **settings: Any):
    """``compute_score`` bound to a model (a ``RewardModel``, a bundle path or a URL) and settings, for Python
    (a verl-omni YAML config points ``custom_reward_function`` at this module instead)."""
    refuse_unknown(settings, {f.name for f in dataclasses.fields(OmniSettings)} - {"model", "load"} | LOAD_KEYS, "verl_omni_compute_score")
    if isinstance(model_or_url, str):
        scorer = scorer_for({"model": model_or_url, **settings})
    else:
        scorer = OmniScorer(OmniSettings(model=model_or_url, **{k: v for k, v in settings.items() if k not in LOAD_KEYS}))

    def fn(data_source=None, solution_image=None, ground_truth=None, extra_info=None, **kwargs) -> dict:
        refuse_unknown(kwargs, OMNI_EXTRAS, "compute_score")
        return scorer.single((data_source, solution_image, ground_truth, extra_info))

    fn.scorer = scorer  # type: ignore[attr-defined]
    return fn
