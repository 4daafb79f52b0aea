"""Hostile or careless use of the RL adapters (issue 33, items 9 and 10): what verl and TRL really pass,
hooks that raise, empty prompts."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from nvrm import make_reward_fn
from nvrm.errors import ConfigError, RewardFnError
from nvrm.rl import trl_reward, verl_compute_score

PROMPT = "A square glides across a tiled floor at constant speed."


def test_verl_batch_takes_numpy_object_arrays_and_refuses_short_columns(demo):
    model, ctx, cands = demo
    fn = verl_compute_score(model)
    info = {"prompt": PROMPT, "context_video": str(ctx)}
    sols = [str(cands["smooth"]), str(cands["frozen"])]
    out = fn.batch(np.array(["v", "v"], dtype=object), sols, [None, None], np.array([info, info], dtype=object))
    assert [o["score"] for o in out] == [r.reward for r in model.score_group(PROMPT, ctx, sols)]
    with pytest.raises(ConfigError, match="2 solution_strs but 1 extra_infos"):  # never one reward for two rollouts
        fn.batch(np.array(["v", "v"], dtype=object), sols, [None, None], np.array([info], dtype=object))


def test_a_render_hook_that_raises_is_logged_once_per_reason_and_counted(demo, caplog):
    model, ctx, cands = demo

    def render(prompt, completion, **row):
        if completion == "bad":
            raise RuntimeError("the world model ran out of memory")
        return str(cands["smooth"])

    reward = trl_reward(model, render=render)
    metrics = {}
    with caplog.at_level(logging.WARNING, logger="nvrm"):
        for _ in range(3):
            out = reward(prompts=[PROMPT] * 3, completions=["ok", "bad", "bad"], context_video=[str(ctx)] * 3, log_metric=metrics.__setitem__)
    assert out[0] is not None and out[1] is None and out[2] is None  # TRL's "not applicable"
    said = [r.getMessage() for r in caplog.records if "out of memory" in r.getMessage()]
    assert len(said) == 1 and "RuntimeError" in said[0], said  # three calls, two failures each: one line
    assert metrics["nvrm_reward/failed_render"] == 2 and metrics["nvrm_reward/failed_other"] == 0


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_an_empty_prompt_is_an_error_naming_the_key(demo, prompt):
    model, ctx, cands = demo
    with pytest.raises(RewardFnError, match=r"the prompt \(prompts\[i\]\) is empty"):
        make_reward_fn(model)([prompt], [str(ctx)], [str(cands["smooth"])])
    out = trl_reward(model)(prompts=[prompt, PROMPT], completions=[str(cands["smooth"])] * 2, context_video=[str(ctx)] * 2)
    assert out[0] is None and out[1] is not None
    with pytest.raises(RewardFnError, match=r"extra_info\['prompt'\]\) is empty"):
        verl_compute_score(model)(data_source="v", solution_str=str(cands["smooth"]), ground_truth=None,
                                  extra_info={"prompt": prompt, "context_video": str(ctx)})
