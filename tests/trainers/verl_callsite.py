"""Runs inside a verl 0.9 environment (not nvrm's): verl's own loader and reward manager call nvrm's verl
functions, in URL mode, against an ``nvrm serve`` started from nvrm's environment.

    python verl_callsite.py URL CONTEXT_PATH CANDIDATE_A CANDIDATE_B

Prints one JSON line: the scores verl's NaiveRewardManager produced, and the error a missing prompt gave.
"""

import asyncio
import json
import sys

import numpy as np
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import verl
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.trainer.ppo.reward import get_custom_reward_fn

import nvrm.rl.verl as nvrm_verl

url, ctx, cand_a, cand_b = sys.argv[1:5]

# a character tokenizer: the policy "wrote" one letter, the render hook maps it to a video
vocab = {"<pad>": 0, "<unk>": 1, "a": 2, "b": 3}
tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>")

with open("render_hook.py", "w") as f:
    f.write(f"def render(prompt, solution, **info):\n    return {{'a': {cand_a!r}, 'b': {cand_b!r}}}[solution.strip()]\n")
sys.path.insert(0, ".")

config = OmegaConf.create({"reward": {"custom_reward_function": {
    "path": nvrm_verl.__file__,  # loaded by path, as verl does
    "name": "compute_score",
    "reward_kwargs": {"model": url, "render": "render_hook:render", "on_error": "raise"},
}}})
compute_score = get_custom_reward_fn(config)
manager = NaiveRewardManager(config, tok, compute_score)


def batch(letters, infos):
    responses = torch.tensor([[vocab[c]] for c in letters])
    return DataProto.from_dict(
        tensors={"responses": responses, "attention_mask": torch.ones_like(responses)},
        non_tensors={
            "data_source": np.array(["video"] * len(letters), dtype=object),
            "reward_model": np.array([{"ground_truth": None}] * len(letters), dtype=object),
            "extra_info": np.array(infos, dtype=object),
        },
    )


async def score(data):  # the reward loop: one task per sample, gathered
    return await asyncio.gather(*[manager.run_single(data[i : i + 1]) for i in range(len(data))], return_exceptions=True)


info = {"prompt": "A square glides across a tiled floor.", "context_video": ctx}
out = manager.loop.run_until_complete(score(batch(["a", "b", "a", "b"], [dict(info) for _ in range(4)])))
for o in out:
    if isinstance(o, BaseException):
        raise o
missing = manager.loop.run_until_complete(score(batch(["a"], [{"context_video": ctx}])))
print(json.dumps({
    "verl": verl.__version__,
    "scores": [o["reward_score"] for o in out],
    "ok": [o["reward_extra_info"]["nvrm_ok"] for o in out],
    "missing_prompt": f"{type(missing[0]).__name__}: {missing[0]}",
}))
