"""verl's legacy ``BatchRewardManager`` calls nvrm's ``compute_score_batch`` with what verl really passes
(numpy object arrays for ``data_sources`` and ``extra_infos``).

    python verl_batch_callsite.py MODEL CONTEXT CANDIDATE_A CANDIDATE_B

Prints one JSON line: the reward tensors of a batch of 4 and of 1, the extra info, the argument types
verl passed, the error a missing prompt gave and the error columns of different lengths gave.
"""

import os
import sys

import numpy as np
from omegaconf import OmegaConf

from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.workers.reward_manager import BatchRewardManager

import nvrm.rl.verl as nvrm_verl
from verl_common import PROMPT, data, emit, tokenizer, write_render_hook

model, ctx, cand_a, cand_b = sys.argv[1:5]
write_render_hook(os.getcwd(), cand_a, cand_b)
sys.path.insert(0, os.getcwd())

config = OmegaConf.create({"reward": {"custom_reward_function": {
    "path": nvrm_verl.__file__,
    "name": "compute_score_batch",
    "reward_kwargs": {"model": model, "render": "render_hook:render", "on_error": "raise"},
}}})
fn = get_custom_reward_fn(config)
types = {}


def spy(**kw):
    types.update({k: type(v).__name__ for k, v in kw.items() if k in ("data_sources", "solution_strs", "ground_truths", "extra_infos")})
    return fn(**kw)


manager = BatchRewardManager(tokenizer(), 0, spy)
info = {"prompt": PROMPT, "context_video": ctx}
four = manager(data(["a", "b", "a", "b"], [dict(info) for _ in range(4)]), return_dict=True)
one = manager(data(["b"], [dict(info)]), return_dict=True)
try:
    manager(data(["a", "b"], [{"context_video": ctx}, dict(info)]), return_dict=True)
    missing = "no error"
except Exception as e:  # noqa: BLE001 - the message is the result
    missing = f"{type(e).__name__}: {e}"
try:
    fn(data_sources=np.array(["video", "video"], dtype=object), solution_strs=["a", "b"], ground_truths=[None, None],
       extra_infos=np.array([dict(info)], dtype=object))
    mismatch = "no error"
except Exception as e:  # noqa: BLE001
    mismatch = f"{type(e).__name__}: {e}"
emit(
    four=four["reward_tensor"].tolist(),
    four_extra={k: [x if k == "nvrm_revision" else float(x) for x in v] for k, v in four["reward_extra_info"].items()},
    one=one["reward_tensor"].tolist(),
    types=types,
    missing_prompt=missing,
    mismatch=mismatch,
)
