"""A reward for trainers that backpropagate it into the generator (ReFL, DRaFT, VADER, guided sampling).

``refl_reward(model)`` returns ``fn(videos, prompts, contexts, *, fps=None) -> rewards [B]``:
``videos`` are the generator's decoded frames, float ``[B, T, C, H, W]`` in [0, 1] on any device, and
the rewards backpropagate to them (``RewardModel.differentiable``). Items that share (prompt, context)
run as one group against one prefilled prefix. A trainer's loss is ``-weight * rewards.mean()``.

The exact contract steps (uint8, Pillow resizes, JPEG) run on the host, so each call copies the
sampled frames (5 per candidate) to the host and back; everything else stays on the tensors' device.
A failure raises: a gradient step cannot use a filled-in reward.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import ConfigError, NvrmError, RewardFnError
from ..source.reward_source import group_items, is_url, shared_model


def refl_reward(model_or_path: Any, *, fps: float = 16.0, checkpointing: bool = True, **load: Any):
    """``fn(videos [B, T, C, H, W] in [0, 1], prompts, contexts, *, fps=None) -> rewards [B]`` with gradients.

    Args:
        model_or_path: a ``RewardModel`` or a bundle path (loaded once per process). Not a URL: gradients
            do not cross the network.
        fps: frame rate of the videos (16 for Wan); a call may pass its own.
        checkpointing: activation checkpointing over the vision blocks and the text layers (less memory,
            one more forward in the backward pass; the same gradients).
    """
    if is_url(model_or_path):
        raise ConfigError("refl_reward needs the model in process: gradients do not cross the network; pass a bundle path or a RewardModel")
    model = model_or_path if hasattr(model_or_path, "differentiable") else shared_model(model_or_path, **load)
    scorer = model.differentiable(checkpointing=checkpointing)
    default_fps = fps

    def fn(videos: Any, prompts: Sequence[Any], contexts: Sequence[Any], *, fps: float | None = None):
        import torch

        rate = fps if fps is not None else default_fps
        n = len(videos)
        if not (len(prompts) == len(contexts) == n):
            raise ConfigError(f"refl_reward: {n} videos, {len(prompts)} prompts, {len(contexts)} contexts")
        for i, (p, c) in enumerate(zip(prompts, contexts)):
            if not isinstance(p, str):
                raise ConfigError(f"refl_reward: prompt {i} is {type(p).__name__}, not text")
            if c is None and not model.contract.no_context:
                raise ConfigError(f"refl_reward: context {i} is None; pass the preceding video (or load the model with Contract(no_context=True))")
        out: list[Any] = [None] * n
        flags: list[list[str]] = [[] for _ in range(n)]
        for idx in group_items(list(prompts), list(contexts)):
            try:
                contiguous = idx == list(range(idx[0], idx[-1] + 1))  # a view, not a copy of whole videos
                rewards = scorer(prompts[idx[0]], contexts[idx[0]], videos[idx[0] : idx[-1] + 1] if contiguous else videos[idx], fps=rate)
            except NvrmError as e:  # the items that share this (prompt, context), named, with the reason
                raise RewardFnError({i: str(e) for i in idx}, n) from e
            for k, i in enumerate(idx):
                out[i] = rewards[k]
                flags[i] = list(scorer.off_contract[k])
        fn.off_contract = flags  # type: ignore[attr-defined]
        return torch.stack(out)

    fn.scorer = scorer  # type: ignore[attr-defined]
    fn.off_contract = []  # type: ignore[attr-defined]  # per video of the last call: the opt-ins its reward used
    return fn
