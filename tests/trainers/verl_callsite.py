"""verl 0.9's loader and its reward loop's NaiveRewardManager call nvrm's ``compute_score``.

    python verl_callsite.py MODEL CONTEXT CANDIDATE_A CANDIDATE_B

MODEL is the URL of an ``nvrm serve`` or a bundle path (in process, on verl's transformers 5).
Prints one JSON line: the scores, ``nvrm_ok``, the error a missing prompt gave, and versions.
"""

import asyncio
import os
import sys

import transformers
from omegaconf import OmegaConf

import verl
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.trainer.ppo.reward import get_custom_reward_fn

import nvrm.rl.verl as nvrm_verl
from verl_common import PROMPT, calls, data, emit, tokenizer, write_render_hook

model, ctx, cand_a, cand_b = sys.argv[1:5]
log = write_render_hook(os.getcwd(), cand_a, cand_b)
sys.path.insert(0, os.getcwd())

config = OmegaConf.create({"reward": {"custom_reward_function": {
    "path": nvrm_verl.__file__,  # loaded by path, as verl does
    "name": "compute_score",
    "reward_kwargs": {"model": model, "render": "render_hook:render", "on_error": "raise"},
}}})
manager = NaiveRewardManager(config, tokenizer(), get_custom_reward_fn(config))


async def score(batch):  # the reward loop: one task per sample, gathered
    return await asyncio.gather(*[manager.run_single(batch[i : i + 1]) for i in range(len(batch))], return_exceptions=True)


info = {"prompt": PROMPT, "context_video": ctx}
out = manager.loop.run_until_complete(score(data(["a", "b", "a", "b"], [dict(info) for _ in range(4)])))
for o in out:
    if isinstance(o, BaseException):
        raise o
missing = manager.loop.run_until_complete(score(data(["a"], [{"context_video": ctx}])))
emit(
    verl=verl.__version__,
    transformers=transformers.__version__,
    scores=[o["reward_score"] for o in out],
    ok=[o["reward_extra_info"]["nvrm_ok"] for o in out],
    missing_prompt=f"{type(missing[0]).__name__}: {missing[0]}",
    in_process="nvrm.scoring.reward_model" in sys.modules,
    hook_keys=calls(log)[0]["keys"],
)
