# Vendored from FastVideo, https://github.com/hao-ai-lab/FastVideo. License: Apache-2.0 (SPDX header of both files).
# - BaseRewardModel: fastvideo/training/rl/rewards/base.py @ f1e0bb4a8df646fc7472cb85d758d30a1794682c (main)
# - MultiRewardAggregator: fastvideo/training/rl/rewards/rewards.py @ 44f0124eaa59f312ff5e10b7fb12866da8e0e4b2
# Adaptations, marked "vendoring:": fastvideo.logger.init_logger is the standard logging module; the
# docstrings are shortened; the rest (ValueModel, DummyRewardModel, create_reward_models) is left out.
# The RL pipeline (rl_pipeline.py, compute_rewards) calls `self.reward_models.compute_reward(videos, prompts)`
# on the aggregator that create_reward_models returns, with normalize_rewards=True.
import logging
from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.nn as nn

logger = logging.getLogger(__name__)  # vendoring: init_logger(__name__)


class BaseRewardModel(ABC, nn.Module):
    def __init__(self, model_path: str | None = None, device: str = "cuda"):
        super().__init__()
        self.model_path = model_path
        self.device = device

    @abstractmethod
    def compute_reward(
        self,
        videos: torch.Tensor,  # [B, T, C, H, W] decoded video sequences
        prompts: list[str] | None,  # Text prompts
        **kwargs: Any
    ) -> torch.Tensor:
        """vendoring: docstring shortened. Returns rewards: Tensor of shape [B]."""
        raise NotImplementedError("Subclasses must implement compute_reward()")

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(model_path={self.model_path})"


class MultiRewardAggregator(nn.Module):
    def __init__(
        self,
        reward_models: list[BaseRewardModel],
        reward_weights: list[float] | None = None,
        normalize_rewards: bool = True
    ):
        super().__init__()
        self.reward_models = nn.ModuleList(reward_models)

        if reward_weights is None:
            reward_weights = [1.0 / len(reward_models)] * len(reward_models)

        assert len(reward_weights) == len(reward_models), \
            f"Number of weights ({len(reward_weights)}) must match number of models ({len(reward_models)})"

        assert abs(sum(reward_weights) - 1.0) < 1e-6, \
            f"Reward weights must sum to 1.0, got {sum(reward_weights)}"

        self.reward_weights = reward_weights
        self.normalize_rewards = normalize_rewards

        logger.info(
            "Initialized MultiRewardAggregator with %d models: %s",
            len(reward_models),
            [(type(m).__name__, w) for m, w in zip(reward_models, reward_weights, strict=False)]
        )

    def compute_reward(
        self,
        videos: torch.Tensor,
        prompts: list[str],
        return_individual: bool = False,
        **kwargs: Any
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        batch_size = videos.shape[0]
        individual_rewards: dict[str, torch.Tensor] = {}

        # Collect rewards from all models
        all_rewards = []
        for i, (model, weight) in enumerate(zip(self.reward_models, self.reward_weights, strict=False)):
            reward = model.compute_reward(videos, prompts, **kwargs)
            assert reward.shape == (batch_size,), \
                f"Reward model {i} returned shape {reward.shape}, expected ({batch_size},)"

            # Optionally normalize individual rewards
            if self.normalize_rewards:
                reward = (reward - reward.mean()) / (reward.std() + 1e-8)

            individual_rewards[f"reward_{type(model).__name__}"] = reward
            all_rewards.append(weight * reward)

        # Aggregate with weights
        aggregated = sum(all_rewards)

        if return_individual:
            individual_rewards["aggregated"] = aggregated
            return individual_rewards

        return aggregated
