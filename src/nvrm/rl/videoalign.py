"""A drop-in for VideoAlign's ``VideoVLMRewardInference``: the same ``reward()`` call, NVRM's reward.

DanceGRPO (``fastvideo/train_grpo_hunyuan.py``, ``train_grpo_skyreels_i2v.py``) builds the
inferencer once and calls ``inferencer.reward([path], [caption], use_norm=True)`` per video, reads
``reward[0]["VQ"]`` / ``["MQ"]``, normalises each per group, and turns any exception into -1.

    inferencer = VideoAlignReward("artifacts/WORL-NVRM", keys=("VQ", "MQ"), no_context=True)

- Each result is ``{"Overall": r}`` with NVRM's raw reward ``r``. VideoAlign's ``VQ`` / ``MQ`` / ``TA``
  are absent unless ``keys=`` names them: each named key then carries the same ``r`` (NVRM has one
  reward, not three); NVRM's reward is never put under another model's name by default.
- VideoAlign's sampling arguments do not change nvrm's contract: ``fps`` must be the contract's
  sample rate, ``num_frames`` its candidate frame count, ``max_pixels`` its pixel bound; any other
  value is refused with a one-line ``ConfigError`` (``None``, VideoAlign's "use the config", is fine).
  ``use_norm`` has no effect: NVRM's reward is raw (no published mean and std to rescale by), and
  DanceGRPO normalises per group itself.
- Errors raise (``RewardFnError`` naming each failed video); DanceGRPO's ``except`` then gives -1 as
  it does for VideoAlign. ``on_error=<number>`` fills failed videos with that number instead.
- Videos of one call that share a prompt and a context are scored as one group (one prefill).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

from ..errors import ConfigError
from .calls import guard_details, score_call
from .context_rule import ContextRule, build_call
from .policy import FailurePolicy, SignalMonitor
from ..source.reward_source import RewardSource, is_url

log = logging.getLogger("nvrm")

VIDEOALIGN_KEYS = ("VQ", "MQ", "TA")
"""VideoAlign's per-dimension keys: present only when ``keys=`` maps NVRM's reward to them."""


class VideoAlignReward:
    """``reward(video_paths, prompts, fps=None, num_frames=None, max_pixels=None, use_norm=True) -> [dict]``."""

    def __init__(self, model_or_url: Any, *, keys: Sequence[str] = (), context: Any = None, context_frames: int = 0,
                 no_context: bool = False, on_error: Any = "raise", short_candidates: bool = False, api_key: str | None = None,
                 device: Any = None, dtype: Any = None, **load: Any):
        """``model_or_url``: a bundle path, a ``RewardModel`` or the ``http(s)://`` URL of ``nvrm serve``.

        ``keys``: VideoAlign keys (``"VQ"``, ``"MQ"``, ``"TA"``) that also carry NVRM's reward.
        ``context`` / ``context_frames`` / ``no_context``: where each video's context comes from
        (``nvrm.rl.context_rule``: fixed, per prompt, the video's leading frames, or none, off-contract).
        ``device`` / ``dtype``: accepted as VideoAlign's constructor takes them (in process only).
        """
        keys = tuple(keys)
        bad = [k for k in keys if k not in VIDEOALIGN_KEYS]
        if bad or len(set(keys)) != len(keys):
            raise ConfigError(f"keys={keys!r}: each must be one of {', '.join(VIDEOALIGN_KEYS)}, at most once ('Overall' is always there)")
        self.keys = keys
        self.rule = ContextRule(context=context, context_frames=context_frames, no_context=no_context)
        self.policy = FailurePolicy.parse(on_error, ("raise",), where="VideoAlignReward on_error")
        given = (("device", device), ("dtype", dtype))
        extra = {k: str(v).replace("torch.", "") if k == "dtype" else str(v) for k, v in given if v is not None}
        if extra and (is_url(model_or_url) or not isinstance(model_or_url, (str, os.PathLike))):
            raise ConfigError(f"{', '.join(extra)}=: only for a bundle path loaded here; a URL or a loaded model already has them")
        self.source = RewardSource(model_or_url, api_key=api_key, short_candidates=short_candidates, no_context=no_context, **load, **extra)
        self.monitor = SignalMonitor("nvrm VideoAlign-shaped reward", "Check that each prompt's videos really differ.")
        self._contract = None

    def reward(self, video_paths: Sequence[Any], prompts: Sequence[str], fps: Any = None, num_frames: Any = None,
               max_pixels: Any = None, use_norm: bool = True) -> list[dict]:
        """One ``{"Overall": reward, **{key: reward for key in keys}}`` per video, in order."""
        self._check_sampling(fps, num_frames, max_pixels)
        paths, texts = list(video_paths), list(prompts)
        if len(paths) != len(texts):
            raise ConfigError(f"VideoAlignReward.reward: {len(paths)} video_paths but {len(texts)} prompts")
        call = build_call(self.rule, texts, [None] * len(paths), paths, prompt_name="prompts[i]")
        rewards, _, _, results = score_call(self.source, call, policy=self.policy, normalize=None, monitor=self.monitor)
        both = guard_details(results, self.source.conservative) if self.source.guarded else None
        return [{"Overall": r, **{k: r for k in self.keys},
                 **({"nvrm_raw_reward": both["raw_reward"][i], "nvrm_uncertainty": both["uncertainty"][i]} if both else {})}
                for i, r in enumerate(rewards)]

    __call__ = reward

    def contract(self):
        """The contract the scores follow (the model's, or the server's, read once)."""
        if self._contract is None:
            if self.source.model is not None:
                self._contract = self.source.model.contract
            else:
                from ..contract import Contract

                self._contract = Contract.from_dict(self.source.client.info()["contract"]["fields"])  # type: ignore[union-attr]
        return self._contract

    def _check_sampling(self, fps: Any, num_frames: Any, max_pixels: Any) -> None:
        if fps is None and num_frames is None and max_pixels is None:
            return
        c = self.contract()
        wanted = {"fps": (fps, c.sample_fps, "frames sampled per second"),
                  "num_frames": (num_frames, round(c.candidate_seconds * c.sample_fps), "candidate frames sampled"),
                  "max_pixels": (max_pixels, c.max_pixels, "pixels per frame at most")}
        for name, (given, own, what) in wanted.items():
            if given is not None and given != own:
                raise ConfigError(f"{name}={given!r}: nvrm's contract fixes the {what} at {own!r}; "
                                  f"pass {name}=None (VideoAlign's default) or {own!r}")
