# Vendored from DanceGRPO, https://github.com/XueZeyue/DanceGRPO @ 15cc71d5 ("Update README.md"),
# file fastvideo/train_grpo_hunyuan.py. License: Apache-2.0 (DanceGRPO's LICENSE).
#
# Only the reward call path: the VideoAlign call of sample_reference_model (lines 260-283) and the per-group
# advantages of train_one_step (lines 370-395). Adaptations, marked "vendoring:": the loop over sampled
# batches is a loop over already written video paths (no transformer, VAE or export_to_video); `args` is
# reduced to the fields these lines read; gather_tensor / dist are left out (one process).
# ruff: noqa: F841 - kept as written upstream (`except Exception as e` with `e` unused)
import os

import torch


def videoalign_rewards(inferencer, video_paths, batch_captions, device="cpu"):
    """vendoring: one iteration per sampled batch of size 1, as in sample_reference_model."""
    all_vq_rewards = []
    all_mq_rewards = []
    for index, (path, batch_caption) in enumerate(zip(video_paths, batch_captions)):
        try:
            with torch.no_grad():
                absolute_path = os.path.abspath(path)  # vendoring: f"./videos/hunyuan_{rank}_{index}.mp4"
                #print("starting video align")
                reward = inferencer.reward(
                    [absolute_path],
                    [batch_caption[0]],
                    use_norm=True,
                )
                vq_reward = torch.tensor(reward[0]['VQ']).to(device)
                all_vq_rewards.append(vq_reward.unsqueeze(0))
                mq_reward = torch.tensor(reward[0]['MQ']).to(device)
                all_mq_rewards.append(mq_reward.unsqueeze(0))
        except Exception as e:
            vq_reward = torch.tensor(-1.0).to(device)
            all_vq_rewards.append(vq_reward.unsqueeze(0))
            mq_reward = torch.tensor(-1.0).to(device)
            all_mq_rewards.append(mq_reward.unsqueeze(0))
    all_vq_rewards = torch.cat(all_vq_rewards, dim=0)
    all_mq_rewards = torch.cat(all_mq_rewards, dim=0)
    return all_vq_rewards, all_mq_rewards


def advantages(samples, num_generations, vq_coef, mq_coef):
    """vendoring: the advantage lines of train_one_step; returns samples and the best-of-n total_scores."""
    n = len(samples["vq_rewards"]) // (num_generations)
    vq_advantages = torch.zeros_like(samples["vq_rewards"])
    mq_advantages = torch.zeros_like(samples["mq_rewards"])

    for i in range(n):
        start_idx = i * num_generations
        end_idx = (i + 1) * num_generations
        group_rewards = samples["vq_rewards"][start_idx:end_idx]
        group_mean = group_rewards.mean()
        group_std = group_rewards.std() + 1e-8
        vq_advantages[start_idx:end_idx] = (group_rewards - group_mean) / group_std

    samples["vq_advantages"] = vq_advantages

    for i in range(n):
        start_idx = i * num_generations
        end_idx = (i + 1) * num_generations
        group_rewards = samples["mq_rewards"][start_idx:end_idx]
        group_mean = group_rewards.mean()
        group_std = group_rewards.std() + 1e-8
        mq_advantages[start_idx:end_idx] = (group_rewards - group_mean) / group_std

    samples["mq_advantages"] = mq_advantages

    # best-of-n
    total_scores = vq_coef * samples["vq_advantages"] + mq_coef * samples["mq_advantages"]
    return samples, total_scores
