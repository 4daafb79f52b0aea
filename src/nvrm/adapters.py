"""The RL adapters under their first name; they live in ``nvrm.rl`` (one scorer, one failure policy)."""

from .rl import FailurePolicy, Normalize, RunningStats, batched, flow_grpo_reward, refl_reward, trl_reward, verl_compute_score

__all__ = ["FailurePolicy", "Normalize", "RunningStats", "batched", "flow_grpo_reward", "refl_reward", "trl_reward", "verl_compute_score"]
