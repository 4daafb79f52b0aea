"""Steps every RL adapter shares: reading trainer values, converting generated videos, one scoring call.

``score_call`` is the single path from a trainer's call to rewards: items refused before scoring
(a missing prompt or context, a video that cannot be read) keep their error; the rest are scored
in groups; then shaping (``Normalize``), the failure policy, and the zero-signal check run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

from ..clip import Clip, is_tensor
from ..errors import ConfigError, InputError
from .policy import FailurePolicy, Normalize, SignalMonitor
from .scorer import RewardSource, group_items


def text_of(value: Any) -> Any:
    """A prompt or completion as trainers pass it: a string, or chat messages (the last message's text)."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        content = value[-1].get("content")
        if isinstance(content, list):  # multimodal content items
            return "".join(c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text")
        return content
    return value


def completion_as_path(value: Any, i: int) -> Any:
    """A completion that must name a video file: the stripped text, or an ``InputError`` saying why not."""
    text = text_of(value)
    if not isinstance(text, str):
        return InputError(f"completion[{i}]", f"is {type(text).__name__}, not a video path; pass render= to turn completions into videos")
    path = text.strip()
    if not path or "\n" in path or not os.path.exists(path):
        shown = path if len(path) <= 60 else path[:57] + "..."
        return InputError(f"completion[{i}]", f"{shown!r} is not an existing video file; pass render= to turn what the policy wrote into a video")
    return path


def video_of(video: Any, fps: Any, where: str) -> Any:
    """One generated video as the scorer takes it, or an ``InputError``.

    Float tensors or arrays in [0, 1], laid out ``[T, C, H, W]`` or ``[T, H, W, 3]``, on any device:
    non-finite values are refused, and so are values further than 0.5 outside [0, 1] (frames in 0..255
    or in [-1, 1]: ``nvrm.clip.float_range_problem`` names the fix); a smaller overshoot is clamped (the
    rule diffusers' video post-processing applies); then ``round(x * 255)`` as uint8, on the tensor's own
    device, so only the frames the contract samples are ever copied to the host. uint8 frames pass as they
    are; other integer types are refused. Paths and bytes pass unchanged.
    """
    from ..clip import float_range_problem

    if isinstance(video, (str, os.PathLike, bytes, bytearray, memoryview)):
        return video
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
        return InputError(where, f"fps {fps!r} is not a positive number")
    try:
        if is_tensor(video):
            import torch

            v = video.detach()
            if v.dtype.is_floating_point:
                if not bool(torch.isfinite(v).all()):
                    return InputError(where, "contains NaN or infinite values")
                if v.numel() and (why := float_range_problem(*(float(x) for x in torch.aminmax(v)))):
                    return InputError(where, why)
                v = (v.float().clamp(0, 1) * 255).round().to(torch.uint8)
            elif v.dtype != torch.uint8:
                return InputError(where, f"is an integer tensor of dtype {str(v.dtype).replace('torch.', '')}; pass float in [0, 1] or uint8")
        else:
            import numpy as np

            v = np.asarray(video)
            if v.dtype.kind == "f":
                if not np.isfinite(v).all():
                    return InputError(where, "contains NaN or infinite values")
                if v.size and (why := float_range_problem(float(v.min()), float(v.max()))):
                    return InputError(where, why)
                v = np.round(np.clip(v.astype(np.float32), 0, 1) * 255).astype(np.uint8)
            elif v.dtype != np.uint8:
                return InputError(where, f"is an integer array of dtype {v.dtype}; pass float in [0, 1] or uint8")
        shape = tuple(v.shape)
        if len(shape) != 4:
            return InputError(where, f"has shape {shape}; expected [T, C, H, W] or [T, H, W, 3] frames")
        if shape[1] == 3 and shape[-1] != 3:
            v = v.permute(0, 2, 3, 1) if is_tensor(v) else v.transpose(0, 2, 3, 1)
        elif shape[-1] != 3:
            return InputError(where, f"has shape {shape}; expected 3 colour channels, [T, 3, H, W] or [T, H, W, 3]")
        return Clip(v, float(fps), name=where)
    except InputError as e:
        return e


@dataclass
class Call:
    """One trainer call's items, with the errors found before scoring."""

    prompts: list[Any]
    contexts: list[Any]
    candidates: list[Any]
    errors: dict[int, str]


def check_items(
    prompts: Sequence[Any], contexts: Sequence[Any], candidates: Sequence[Any], *, prompt_name: str, context_name: str, no_context: bool = False
) -> Call:
    """Missing prompts and contexts are errors naming their key (a missing context is scored without one
    only under the ``no_context`` opt-in); failed conversions keep their message."""
    errors: dict[int, str] = {}
    for i, (p, c, v) in enumerate(zip(prompts, contexts, candidates)):
        if p is None:
            errors[i] = f"item {i}: no prompt ({prompt_name} is missing or None)"
        elif not isinstance(p, str):
            errors[i] = f"item {i}: the prompt ({prompt_name}) is {type(p).__name__}, not text"
        elif not p.strip():
            errors[i] = f"item {i}: the prompt ({prompt_name}) is empty; the reward is conditioned on it"
        elif c is None and not no_context:
            errors[i] = f"item {i}: no context ({context_name} is missing or None; no_context=True scores without one, off-contract)"
        elif isinstance(v, BaseException):
            errors[i] = str(v)
    return Call(list(prompts), list(contexts), list(candidates), errors)


def score_call(
    source: RewardSource,
    call: Call,
    *,
    policy: FailurePolicy,
    normalize: Normalize | None,
    monitor: SignalMonitor | None,
) -> tuple[list[Any], list[list[int]], dict[int, str], list[Any]]:
    """(rewards after shaping and the failure policy, groups, errors, raw results) for one call."""
    n = len(call.prompts)
    # one grouping for the call (the contexts keyed once): scoring, shaping and failure fills all use it,
    # refused items included, so a refused item gets its own group's mean
    every = group_items(call.prompts, call.contexts)
    ok = [i for i in range(n) if i not in call.errors]
    results: list[Any] = [None] * n
    groups: list[list[int]] = []
    if ok:
        position = {i: k for k, i in enumerate(ok)}
        scored = [[position[i] for i in g if i in position] for g in every]
        got, sub_groups = source.score([call.prompts[i] for i in ok], [call.contexts[i] for i in ok], [call.candidates[i] for i in ok],
                                       groups=[g for g in scored if g])
        for k, i in enumerate(ok):
            results[i] = got[k]
        groups = [[ok[k] for k in g] for g in sub_groups]
    errors = dict(call.errors)
    for i, r in enumerate(results):
        if isinstance(r, BaseException):
            errors[i] = str(r)
        elif r is not None and getattr(source, "conservative", None) is not None and getattr(r, "uncertainty", None) is None:
            # never a raw reward handed out as a conservative one
            errors[i] = f"item {i}: no uncertainty came with its reward (the model that scored it has no guard), so no conservative reward"
    weight = getattr(source, "conservative", None)
    rewards: list[Any] = [None if i in errors else float(results[i].reward if weight is None else results[i].conservative(weight)) for i in range(n)]
    if monitor is not None:
        monitor.check(groups, call.candidates, rewards)
        monitor.failures(errors)
    if normalize is not None and normalize.active:
        rewards = normalize(rewards, every)
    return policy.apply(rewards, every, errors), every, errors, results


def guard_details(results: Sequence[Any], weight: float | None) -> dict[str, Any]:
    """Both values of a call's rewards, for the adapters to hand on beside the one the trainer optimises: the raw rewards,
    the uncertainties (None where an item failed, or without a guard) and the λ the conservative rewards used (None: raw)."""
    scored = [r if not isinstance(r, BaseException) and r is not None else None for r in results]
    return {
        "raw_reward": [None if r is None else float(r.reward) for r in scored],
        "uncertainty": [None if r is None or getattr(r, "uncertainty", None) is None else float(r.uncertainty) for r in scored],
        "conservative": weight,
    }


def guard_columns(source: Any, results: Sequence[Any]) -> dict[str, list[float]]:
    """Per-item numeric columns of both values for trainers that log extra columns (verl's ``reward_extra_info``):
    ``nvrm_raw_reward`` and ``nvrm_uncertainty`` (NaN where an item failed), only when the model has a guard."""
    if not getattr(source, "guarded", False):
        return {}
    d = guard_details(results, getattr(source, "conservative", None))
    nan = float("nan")
    return {"nvrm_raw_reward": [nan if v is None else v for v in d["raw_reward"]],
            "nvrm_uncertainty": [nan if v is None else v for v in d["uncertainty"]]}


def refuse_unknown(kwargs: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def off_contract(results: Sequence[Any]) -> list[list[str]]:
    """Per item, the off-contract reasons of its result (empty for failed items and contract results)."""
    return [list(getattr(r, "off_contract", ()) or ()) for r in results]
