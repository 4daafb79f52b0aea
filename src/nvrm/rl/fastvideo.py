"""FastVideo's RL reward interface: ``compute_reward(videos, prompts, **kwargs) -> Tensor[B]``.

FastVideo (main, ``fastvideo/training/rl/rewards/base.py``) defines ``BaseRewardModel(ABC, nn.Module)``
with ``compute_reward(videos [B, T, C, H, W] in [0, 1], prompts) -> [B]``; ``create_reward_models``
(its registry, ``rewards.py``) puts each model in a ``MultiRewardAggregator``, an ``nn.ModuleList``
that z-scores each model's rewards over the batch and sums them by weight. Its RL pipeline calls
``self.reward_models.compute_reward(videos, prompts)`` with the decoded rollouts (its comments say
``[B, C, T, H, W]``): ``layout="auto"`` takes either, by where the 3 colour channels are.

    # fastvideo/training/rl/rewards/rewards.py, create_reward_models:
    elif reward_type == "nvrm":
        model = FastVideoReward("artifacts/WORL-NVRM", fps=16, context_frames=1, device=device)

The pipeline passes no metadata and no frame rate: ``fps`` is set here (the rollouts' rate), and the
context is the rollouts' leading frames, a fixed context per prompt, or ``metadata=[{...}]`` when a
caller passes it (``nvrm.rl.context_rule``). Rewards are NVRM's raw rewards as float32 on the videos'
device. A failed video raises ``RewardFnError`` (FastVideo has no failure convention: its step stops);
``on_error="group_mean"`` gives it its group's mean instead, so the batch z-score stays finite.

This module imports torch (FastVideo's reward models are ``nn.Module``s); ``nvrm.rl`` imports it lazily.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..errors import ConfigError
from .calls import guard_details, score_call, video_of
from .context_rule import ContextRule, build_call, frames_of
from .policy import FailurePolicy, SignalMonitor
from ..source.reward_source import RewardSource, is_url


class FastVideoReward(torch.nn.Module):
    """An NVRM reward with FastVideo's ``BaseRewardModel`` interface (``model_path``, ``device``, ``compute_reward``)."""

    def __init__(self, model_or_url: Any, *, fps: float = 16.0, layout: str = "auto", context: Any = None, context_key: str | None = None,
                 context_frames: int = 0, no_context: bool = False, on_error: Any = "raise", short_candidates: bool = False,
                 api_key: str | None = None, device: Any = None, **load: Any):
        """``model_or_url``: a bundle path, a ``RewardModel`` or the URL of ``nvrm serve``; ``fps``: the rollouts' frame rate;
        ``layout``: ``auto``, ``TCHW`` or ``CTHW`` (each video of the batch); the context: see ``nvrm.rl.context_rule``."""
        super().__init__()
        self.model_path = model_or_url if isinstance(model_or_url, str) else None
        self.device = str(device) if device is not None else None
        self.fps = fps
        self.layout = layout
        frames_of(None, layout, "layout")  # validates the name
        self.rule = ContextRule(context=context, context_key=context_key, context_frames=context_frames, no_context=no_context)
        self.policy = FailurePolicy.parse(on_error, ("raise", "group_mean"), where="FastVideoReward on_error")
        in_process = not is_url(model_or_url) and not hasattr(model_or_url, "score_groups")
        extra = {"device": str(device)} if device is not None and in_process and "device" not in load else {}
        self.source = RewardSource(model_or_url, api_key=api_key, short_candidates=short_candidates, no_context=no_context, **load, **extra)
        self.monitor = SignalMonitor("nvrm FastVideo reward", "Check that each prompt's rollouts really differ.")
        self.last_errors: dict[int, str] = {}
        """The failed items of the last call (index -> message), for logging."""
        self.last_details: dict[str, Any] = {}
        """The last call's raw rewards, uncertainties and the conservative λ (``nvrm.rl.calls.guard_details``), for logging."""

    def compute_reward(self, videos: Any, prompts: Sequence[str] | None, **kwargs: Any) -> torch.Tensor:
        """NVRM's reward per video: ``[B]`` float32 on ``videos``' device.

        ``kwargs``: ``metadata`` (one dict per video, for ``context_key``) and ``fps`` (overrides the
        constructor's); any other keyword is refused.
        """
        unknown = sorted(set(kwargs) - {"metadata", "fps"})
        if unknown:
            raise ConfigError(f"FastVideoReward.compute_reward: unexpected keyword argument(s) {', '.join(unknown)}")
        n = int(videos.shape[0]) if hasattr(videos, "shape") else len(videos)
        if prompts is None or len(prompts) != n:
            raise ConfigError(f"FastVideoReward.compute_reward: {n} videos but {'no' if prompts is None else len(prompts)} prompts")
        metas = list(kwargs.get("metadata") or [{}] * n)
        if len(metas) != n:
            raise ConfigError(f"FastVideoReward.compute_reward: {n} videos but {len(metas)} metadata entries")
        fps = kwargs.get("fps", self.fps)
        cands = []
        for i in range(n):
            v = frames_of(videos[i], self.layout, f"video {i}")
            cands.append(v if isinstance(v, BaseException) else video_of(v, fps, f"video {i}"))
        call = build_call(self.rule, list(prompts), metas, cands, prompt_name="prompts[i]")
        rewards, _, errors, results = score_call(self.source, call, policy=self.policy, normalize=None, monitor=self.monitor)
        self.last_errors = errors
        self.last_details = guard_details(results, self.source.conservative)
        device = videos.device if hasattr(videos, "device") else None
        return torch.tensor(rewards, dtype=torch.float32, device=device)

    def forward(self, videos: Any, prompts: Sequence[str] | None, **kwargs: Any) -> torch.Tensor:
        """``compute_reward`` (an ``nn.Module`` is called through ``forward``)."""
        return self.compute_reward(videos, prompts, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_path={self.model_path})"
