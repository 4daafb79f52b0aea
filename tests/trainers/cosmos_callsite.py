"""Runs cosmos-rl 0.4.7's own remote-reward client code, unchanged, against an ``nvrm serve``.

    python cosmos_callsite.py BASE_URL TOKEN VAE_DIR OUT_DIR [REWARD_FNS]

cosmos-rl is installed without its dependencies (its wheel pulls vLLM, NCCL and another torch); its
two package ``__init__`` files, which import every subsystem, are skipped: the client modules
themselves run as shipped. Writes OUT_DIR/result.json and the latents each path sent (.npy), so the
test can score the same decoded frames in process:

- legacy: ``RemoteReward`` (the WFM trainer's) ``compute_reward(is_async=True)`` + ``fetch_reward``,
  8 rollouts of one prompt sent at once (B = 1 each, one conditioning frame), then a wrong token;
- calculator: ``RemoteRewardCalculator`` ``compute_rewards`` + ``get_results``, with the encoder it
  builds on a GPU replaced by the same tiny VAE's real encoder (the one thing that needs CUDA);
- decoder: cosmos-rl's own Wan2.1 decoder against diffusers' on random weights.

With REWARD_FNS (JSON ``{name: weight}``, issue 39) only the calculator runs, its ``reward_fns`` those names,
and each name's raw scores are pulled again by ``type`` (result ``types``) beside its weighted total.
"""

import json
import os
import sys
import threading
import types
from pathlib import Path

import numpy as np
import torch

BASE, TOKEN, VAE_DIR, OUT = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
FNS = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
ENQUEUE, FETCH = BASE + "/api/reward/enqueue", BASE + "/api/reward/pull"
site = next(p for p in sys.path if os.path.isdir(os.path.join(p, "cosmos_rl")))
for name in ("cosmos_rl", "cosmos_rl.policy.model"):  # skip the package __init__s only
    module = types.ModuleType(name)
    module.__path__ = [os.path.join(site, *name.split("."))]
    sys.modules[name] = module

import cosmos_rl.utils.network_util as network_util  # noqa: E402
from cosmos_rl.policy.config.wfm import RemoteRewardConfig  # noqa: E402
from cosmos_rl.policy.model.wfm.rewards.reward_models import RemoteReward  # noqa: E402

from importlib.metadata import version  # noqa: E402

OUT.mkdir(parents=True, exist_ok=True)
result: dict = {"cosmos_rl": version("cosmos-rl"), "retry_helper": network_util.make_request_with_retry.__name__}
PROMPT = "A square glides across a tiled floor."

# ---------------------------------------------------------------- legacy RemoteReward: a group of 8, B = 1 each
g = torch.Generator().manual_seed(11)


def legacy() -> None:
    shared = torch.randn(1, 16, 1, 8, 12, generator=g)  # latent frame 0: the conditioning frame every rollout shares
    group = [torch.cat([shared, torch.randn(1, 16, 23, 8, 12, generator=g)], dim=2) for _ in range(8)]  # 93 frames of 64x96
    np.save(OUT / "legacy.npy", torch.cat(group).numpy())
    cfg = RemoteRewardConfig(token=TOKEN, enqueue_url=ENQUEUE, fetch_url=FETCH, reward_fn="nvrm", score_key="reward")
    reward = RemoteReward(cfg)
    rewards: list = [None] * 8

    def rollout(i: int) -> None:  # each rank of the trainer sends its own rollout
        _, uuid, replica = reward.compute_reward({"ai_caption": [PROMPT]}, None, latents=group[i], is_async=True)
        rewards[i] = reward.fetch_reward(uuid, replica).tolist()

    threads = [threading.Thread(target=rollout, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result["legacy"] = rewards
    try:
        RemoteReward(RemoteRewardConfig(token="wrong", enqueue_url=ENQUEUE, fetch_url=FETCH, reward_fn="nvrm", score_key="reward")).compute_reward(
            {"ai_caption": [PROMPT]}, None, latents=group[0], is_async=True)
        result["wrong_token"] = "accepted"
    except Exception as e:  # noqa: BLE001 - what the trainer would see
        result["wrong_token"] = f"{type(e).__name__}: {e}"


if FNS is None:
    legacy()

# ---------------------------------------------------------------- RemoteRewardCalculator
os.environ.update(REMOTE_REWARD_ENQUEUE_URL=ENQUEUE, REMOTE_REWARD_FETCH_URL=FETCH, REMOTE_REWARD_TOKEN=TOKEN)
from queue import Queue  # noqa: E402

from cosmos_rl.dispatcher.data.schema import RLPayload  # noqa: E402
from cosmos_rl.policy.config import Config, RewardFunctionConfig  # noqa: E402
from cosmos_rl.reward.remote_calculator import RemoteRewardCalculator  # noqa: E402
from diffusers import AutoencoderKLWan  # noqa: E402

config = Config()
config.train.train_policy.use_remote_reward = True
config.train.train_policy.remote_reward.reward_fns = [RewardFunctionConfig(name=name, weight=weight, score_key="reward")
                                                     for name, weight in (FNS or {"nvrm": 1.0}).items()]
calc = RemoteRewardCalculator.get_instance()
calc.setup(config)  # its Wan2.1 encoder needs CUDA and hub weights: it logs that, and the encoder below stands in
vae = AutoencoderKLWan.from_pretrained(VAE_DIR).eval()
mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
sent: list = []


class WanEncoder:
    """Wan2pt1VAEInterface.encode's contract on the tiny VAE: pixels [B, 3, T, H, W] in [-1, 1] -> normalised latents."""

    def encode(self, x):
        with torch.no_grad():
            z = (vae.encode(x.float()).latent_dist.mode() - mean) / std
        sent.append(z.to(torch.float16).numpy())  # what the calculator sends (it casts to float16)
        return z


calc.tokenizer = WanEncoder()
videos = torch.rand(3, 93, 3, 64, 96, generator=torch.Generator().manual_seed(5))
videos[:, 0] = videos[0, 0]  # one conditioning frame for the prompt's rollouts
payload = RLPayload(prompt={"prompt": PROMPT}, prompt_idx=0, completions=videos, extra_info={"modality": "video"})
uuid = calc.compute_rewards([payload], is_validation=False, step=1)
queue = Queue()
queue.put(uuid)
out, _, _ = calc.get_results(queue)
result["calculator"] = list(out[0].rewards)
np.save(OUT / "calculator.npy", np.concatenate(sent))
if FNS is not None:  # each name's raw scores, pulled again by type, and how the calculator combined them
    import requests  # noqa: E402

    remote = config.train.train_policy.remote_reward
    result["types"] = {fn.name: requests.post(FETCH, data={"uuid": uuid, "type": fn.name}, headers={"Authorization": f"Bearer {TOKEN}"},
                                              timeout=30).json()["scores"]["reward"] for fn in remote.reward_fns}
    result["clips"] = {fn.name: [fn.clip_min, fn.clip_max, fn.weight] for fn in remote.reward_fns}
    result["total_clip"] = [remote.reward_clip_min, remote.reward_clip_max, remote.scale]
    (OUT / "result.json").write_text(json.dumps(result))
    print("COSMOS_OK")
    sys.exit(0)

# ---------------------------------------------------------------- decoders: cosmos-rl's Wan2.1 vs diffusers'
from cosmos_rl.policy.model.wfm.tokenizer.wan2pt1 import WanVAE_  # noqa: E402
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers  # noqa: E402

torch.manual_seed(0)
arch = dict(z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[], temperal_downsample=[False, True, True])
theirs = WanVAE_(dim=8, dropout=0.0, **arch).eval()
with torch.no_grad():  # its norms start at 1: perturb every weight so the comparison means something
    for p in theirs.parameters():
        p.add_(0.05 * torch.randn_like(p))
ours = AutoencoderKLWan(base_dim=8, **arch).eval()
ours.load_state_dict(convert_wan_vae_to_diffusers(theirs.state_dict()), strict=True)
z = torch.randn(1, 16, 3, 8, 8)
with torch.no_grad():
    a = theirs.decode(z, [mean.flatten(), 1.0 / std.flatten()]).clamp(-1, 1)  # cosmos-rl's un-normalisation
    b = ours.decode(z / (1.0 / std) + mean).sample
result["decoder_max_abs_diff"] = float((a - b).abs().max())
(OUT / "result.json").write_text(json.dumps(result))
print("COSMOS_OK")
