"""flow-GRPO: a reward factory for ``flow_grpo/rewards.py`` ``multi_score``.

flow-GRPO (``scripts/train_wan2_1.py``) builds ``multi_score(accelerator.device, config.reward_fn)``,
which calls each factory with the device, then submits ``reward_fn(videos, prompts, prompt_metadata,
only_strict=True)`` to an 8-thread executor for every sampling batch before awaiting any result.
``multi_score`` unpacks ``scores, _ = fn(videos, prompts, metadata)``: the info is dropped, so a
failed item must not leave a value that poisons ``PerPromptStatTracker`` (which has no NaN handling).
``videos`` is ``[B, T, C, H, W]`` float in [0, 1] on the accelerator.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .calls import check_items, guard_details, off_contract, score_call, video_of
from .policy import FailurePolicy, Normalize, SignalMonitor
from ..source.reward_source import RewardSource, is_url

FLOW_GRPO_KWARGS = {"only_strict", "ref_images"}
"""Keyword arguments ``multi_score`` passes that a video reward has no use for."""


def flow_grpo_reward(
    model_or_url: Any,
    *,
    context_key: str = "context_video",
    fps_key: str = "fps",
    fps: float = 16.0,
    on_error: Any = "raise",
    normalize: Normalize | None = None,
    short_candidates: bool = False,
    no_context: bool = False,
    api_key: str | None = None,
    **load: Any,
):
    """A flow-GRPO reward factory (register it in flow-GRPO's ``score_functions``).

    ``metadata[i][context_key]`` gives each sample's context (a path, bytes, ``Clip`` or frames);
    ``metadata[i][fps_key]`` (default ``fps``, 16 for Wan) the frame rate of the generated videos.

    ``on_error``: ``"raise"`` (default), ``"group_mean"`` (recommended for training: a failed item gets
    the mean of its prompt's scored items, so its advantage is 0 and no NaN reaches the stat
    tracker), ``"nan"`` or a finite number. Failed indices and their messages are in
    ``info["nvrm_failed"]`` / ``info["nvrm_errors"]``.

    ``short_candidates`` / ``no_context``: the contract's off-contract opt-ins (clips under 5 s, such
    as the Wan recipe's 33 frames; prompts with no context video, ``metadata`` ``{}``). Every result
    that used one lists why in ``info["nvrm_off_contract"]``.

    Returns:
        ``factory(device=None) -> fn(videos, prompts, metadata, **kw) -> (scores, info)``. A bundle
        path is loaded once per process, on ``device`` unless ``device=`` was given here.
    """
    policy = FailurePolicy.parse(on_error, ("raise", "group_mean", "nan"))
    state: dict[str, RewardSource] = {}

    def factory(device: Any = None):
        if "source" not in state:
            extra = (
                {"device": str(device)}
                if device is not None and not is_url(model_or_url) and not hasattr(model_or_url, "score_groups") and "device" not in load
                else {}
            )
            state["source"] = RewardSource(model_or_url, api_key=api_key, short_candidates=short_candidates, no_context=no_context, **load, **extra)
        source = state["source"]
        monitor = SignalMonitor("nvrm flow-GRPO reward", "Check that each prompt's samples really differ.")

        def fn(videos, prompts, metadata, **kwargs):
            unknown = sorted(set(kwargs) - FLOW_GRPO_KWARGS)
            if unknown:
                raise ConfigError(f"nvrm flow-GRPO reward: unexpected keyword argument(s) {', '.join(unknown)}")
            n = len(videos)
            if not (len(prompts) == len(metadata) == n):
                raise ConfigError(f"nvrm flow-GRPO reward: {n} videos, {len(prompts)} prompts, {len(metadata)} metadata entries")
            metas = [m if isinstance(m, dict) else {} for m in metadata]
            cands = [video_of(v, m.get(fps_key, fps), f"video {i}") for i, (v, m) in enumerate(zip(videos, metas))]
            call = check_items(list(prompts), [m.get(context_key) for m in metas], cands, prompt_name="prompts[i]",
                               context_name=f"metadata[i][{context_key!r}]", no_context=no_context)
            scores, _, errors, results = score_call(source, call, policy=policy, normalize=normalize, monitor=monitor)
            return scores, {
                "nvrm_failed": sorted(errors),
                "nvrm_errors": [errors.get(i) for i in range(n)],
                "nvrm_off_contract": off_contract(results),
                **{f"nvrm_{k}": v for k, v in guard_details(results, source.conservative).items()},
            }

        return fn

    return factory
