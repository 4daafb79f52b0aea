"""verl 0.9's real reward loop, as its trainer runs it: ``RewardLoopManager`` starts its reward workers
as Ray actors, and each loads nvrm's ``compute_score`` (``pkg://nvrm.rl.verl``) and scores there.

    python verl_loop_callsite.py MODEL CONTEXT CANDIDATE_A CANDIDATE_B

Prints one JSON line: the token-level reward scores' last values, the extra keys, ``nvrm_ok``, and
which processes rendered (the actors, not this driver).
"""

import os
import sys

import ray
import torch
from omegaconf import OmegaConf

from verl.experimental.reward_loop import RewardLoopManager

from verl_common import PROMPT, calls, data, emit, tokenizer, write_render_hook

model, ctx, cand_a, cand_b = sys.argv[1:5]
here = os.getcwd()
log = write_render_hook(here, cand_a, cand_b)
tokenizer().save_pretrained(os.path.join(here, "tok"))
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
         runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}})
config = OmegaConf.create({
    "actor_rollout_ref": {"model": {"path": os.path.join(here, "tok"), "tokenizer_path": None}},
    "reward": {
        "num_workers": 1,
        "custom_reward_function": {"path": "pkg://nvrm.rl.verl", "name": "compute_score",
                                   "reward_kwargs": {"model": model, "render": "render_hook:render", "on_error": "raise"}},
        "reward_manager": {"source": "register", "name": "naive", "module": {"path": None, "name": "custom_reward_manager"}},
        "reward_model": {"enable": False, "enable_resource_pool": False, "model_path": None, "rollout": {"full_determinism": False}},
        "sandbox_fusion": {"url": None},
    },
})
manager = RewardLoopManager(config)
info = {"prompt": PROMPT, "context_video": ctx}
letters = ["a", "b"] * 4
out = manager.compute_rm_score(data(letters, [dict(info) for _ in letters]))
seen = calls(log)
emit(
    scores=out.batch["rm_scores"][:, 0].tolist(),
    rest_zero=bool((out.batch["rm_scores"][:, 1:] == 0).all()),
    extra_keys=list(out.meta_info["reward_extra_keys"]),
    ok=[float(x) for x in out.non_tensor_batch["nvrm_ok"]],
    driver=os.getpid(),
    renderers=sorted({c["pid"] for c in seen}),
    torch=torch.__version__,
)
ray.shutdown()
