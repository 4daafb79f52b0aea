"""Reward functions for RL trainers, over one scorer and one failure policy.

- ``trl_reward``: TRL's ``GRPOTrainer(reward_funcs=[...])``.
- ``nvrm.rl.verl``: verl's custom reward functions (``compute_score``, ``compute_score_batch``),
  configured from ``reward_kwargs``; ``verl_compute_score`` binds them in Python.
- ``flow_grpo_reward``: a flow-GRPO ``multi_score`` factory.
- ``refl_reward``: a differentiable reward for trainers that backpropagate it (ReFL, DRaFT, VADER).
- ``VideoAlignReward``: a drop-in for VideoAlign's inferencer (DanceGRPO's scripts call its ``reward()``).
- ``FastVideoReward``: FastVideo's ``compute_reward(videos, prompts)`` reward model (an ``nn.Module``,
  imported lazily: it brings torch).
- ``nvrm.rl.verl_omni``: verl-omni's custom visual reward (``compute_score``); ``verl_omni_compute_score``
  binds it in Python.
- ``batched``: marks a ``render`` hook that takes a whole call.
- ``Normalize``, ``FailurePolicy``: shaping and failure handling shared by all of them and ``make_reward_fn``.

URL mode (``http(s)://`` of ``nvrm serve``) needs only ``nvrm[client]``: nothing here imports torch
until an in-process model is loaded.
"""

from .flow_grpo import flow_grpo_reward
from .policy import FailurePolicy, Normalize, RunningStats
from .refl import refl_reward
from .render import batched
from .trl import trl_reward
from .verl import verl_compute_score
from .verl_omni import verl_omni_compute_score
from .videoalign import VideoAlignReward

__all__ = ["FailurePolicy", "FastVideoReward", "Normalize", "RunningStats", "VideoAlignReward", "batched", "flow_grpo_reward",
           "refl_reward", "trl_reward", "verl_compute_score", "verl_omni_compute_score"]


def __getattr__(name: str):
    if name == "FastVideoReward":  # an nn.Module: importing it imports torch
        from .fastvideo import FastVideoReward

        return FastVideoReward
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
