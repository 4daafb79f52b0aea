# Vendored from verl-omni, https://github.com/verl-project/verl-omni @ a1139baf
# ("[doc] fix: move Config Explanation under Configuration in docs navigation (#422)"),
# files verl_omni/reward_loop/reward_manager/visual.py and multi.py. License: Apache-2.0
# (Copyright 2026 Bytedance Ltd. and/or its affiliates).
#
# Only the reward call path of VisualRewardManager.run_single and MultiVisualRewardManager (its sub-reward
# table and run_single's loop). Adaptations, marked "vendoring:": the DataProto item is already unpacked into
# (data_source, response_visual, ground_truth, extra_info); `self.loop` / `self.config` are arguments;
# load_extern_object is a callable argument; the reward-router kwargs are left out (no router here).
import inspect
import logging

import torch

logger = logging.getLogger(__name__)


def _validate_visual_response(response_visual, output_type) -> None:
    # vendoring: output_type is passed in (read from config.actor_rollout_ref.rollout.pipeline)
    if output_type == "latent":
        if not isinstance(response_visual, torch.Tensor) or not response_visual.dtype.is_floating_point:
            dtype = getattr(response_visual, "dtype", type(response_visual))
            raise ValueError(f"Expected floating-point latent responses, got {dtype}.")
    elif not isinstance(response_visual, torch.Tensor) or response_visual.dtype != torch.uint8:
        dtype = getattr(response_visual, "dtype", type(response_visual))
        raise ValueError(f"Expected uint8 pixel responses for output_type={output_type!r}, got {dtype}.")


async def visual_run_single(compute_score, loop, data_source, response_visual, ground_truth, extra_info, output_type="image"):
    """vendoring: VisualRewardManager.run_single from the unpacked item on."""
    _validate_visual_response(response_visual, output_type)
    extra_info["num_turns"] = None  # vendoring: data_item.non_tensor_batch.get("__num_turns__", None)
    extra_info["rollout_reward_scores"] = {}
    extra_reward_kwargs = {}
    if inspect.iscoroutinefunction(compute_score):
        result = await compute_score(
            data_source=data_source,
            solution_image=response_visual,
            ground_truth=ground_truth,
            extra_info=extra_info,
            **extra_reward_kwargs,
        )
    else:
        result = await loop.run_in_executor(
            None,
            lambda: compute_score(
                data_source=data_source,
                solution_image=response_visual,
                ground_truth=ground_truth,
                extra_info=extra_info,
                **extra_reward_kwargs,
            ),
        )

    reward_extra_info = {}

    score: float
    if isinstance(result, dict):
        score = result["score"]
        for key, value in result.items():
            if key == "score":
                continue
            reward_extra_info[key] = value
    else:
        score = result
        reward_extra_info["acc"] = score

    reward = score

    return {"reward_score": reward, "reward_extra_info": reward_extra_info}


def _filter_kwargs(all_kwargs: dict, sig: inspect.Signature) -> dict:
    params = sig.parameters
    # Check if the function accepts **kwargs
    for param in params.values():
        if param.kind == inspect.Parameter.VAR_KEYWORD:
            return all_kwargs
    # Only pass declared parameters
    return {k: v for k, v in all_kwargs.items() if k in params}


def build_sub_rewards(reward_functions_cfg, load_extern_object):
    """vendoring: MultiVisualRewardManager.__init__'s sub-reward table."""
    sub_rewards = []
    total_weight = 0.0
    _reserved_keys = {"path", "name", "weight", "required"}
    for key, entry in reward_functions_cfg.items():
        path = entry["path"]
        name = entry["name"]
        weight = float(entry.get("weight", 1.0))
        required_value = entry.get("required", False)
        if isinstance(required_value, str):
            normalized = required_value.lower()
            if normalized not in {"true", "false"}:
                raise ValueError(f"Invalid required value: {required_value!r}")
            required = normalized == "true"
        elif isinstance(required_value, bool):
            required = required_value
        else:
            raise TypeError(f"required must be a boolean, got {type(required_value).__name__}")
        total_weight += weight

        # Collect extra config fields (beyond path/name/weight) to pass to compute_score
        extra_args = {k: v for k, v in entry.items() if k not in _reserved_keys}

        fn = load_extern_object(path, name)
        sig = inspect.signature(fn)
        is_async = inspect.iscoroutinefunction(fn)

        sub_rewards.append(
            {
                "key": key,
                "fn": fn,
                "weight": weight,
                "required": required,
                "sig": sig,
                "is_async": is_async,
                "extra_args": extra_args,
            }
        )
    return sub_rewards


async def multi_run_single(sub_rewards, loop, data_source, response_visual, ground_truth, extra_info, output_type="image"):
    """vendoring: MultiVisualRewardManager.run_single from the unpacked item on."""
    _validate_visual_response(response_visual, output_type)
    extra_info["num_turns"] = None
    extra_info["rollout_reward_scores"] = {}
    extra_reward_kwargs = {}

    # Build the full kwargs dict that any sub-function might need
    all_kwargs = {
        "data_source": data_source,
        "solution_image": response_visual,
        "ground_truth": ground_truth,
        "extra_info": extra_info,
        **extra_reward_kwargs,
    }

    combined_score = 0.0
    reward_extra_info = {}

    for sub in sub_rewards:
        key = sub["key"]
        fn = sub["fn"]
        weight = sub["weight"]
        required = sub["required"]
        sig = sub["sig"]
        is_async = sub["is_async"]
        extra_args = sub["extra_args"]

        # Merge per-reward extra config fields into kwargs
        sub_kwargs = {**all_kwargs, **extra_args}
        filtered_kwargs = _filter_kwargs(sub_kwargs, sig)

        try:
            if is_async:
                result = await fn(**filtered_kwargs)
            else:
                result = await loop.run_in_executor(None, lambda f=fn, kw=filtered_kwargs: f(**kw))

            if isinstance(result, dict):
                score = float(result["score"])
                for rk, rv in result.items():
                    if rk == "score":
                        continue
                    reward_extra_info[f"reward/{key}/{rk}"] = rv
            else:
                score = float(result)

        except Exception as e:
            if required:
                raise RuntimeError(f"Required sub-reward '{key}' failed: {e}") from e
            logger.error(f"Sub-reward '{key}' raised an exception: {e}. Contributing 0 to weighted sum.")
            score = 0.0

        reward_extra_info[f"reward/{key}"] = score
        combined_score += weight * score

    reward_extra_info["reward/combined"] = combined_score
    return {"reward_score": combined_score, "reward_extra_info": reward_extra_info}
