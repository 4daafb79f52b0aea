"""The ``no_context`` opt-in: scoring with no preceding video, only where the user asks for it.

Without the opt-in a missing context is an error naming the slot and the fix, on every path. With it,
every path gives the reward the independent reference gives for the same layout with zero context
images, bit for bit on this machine, and every result says it is off-contract.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from nvrm import Clip, Contract, RewardModel
from nvrm.errors import ConfigError, InputError, RewardFnError
from nvrm.video.inputs import prepare_input
from nvrm.synth.clips import moving_square

CANDS = [Clip(moving_square(5, 64, 96, seed=10 + i, speed=1 + i), fps=1) for i in range(3)]
CTX = Clip(moving_square(3, 64, 96, seed=1), fps=1)


@pytest.fixture(scope="module")
def open_model(tiny_bundle):
    contract = dataclasses.replace(Contract.for_bundle(tiny_bundle), no_context=True)
    m = RewardModel.from_pretrained(tiny_bundle, device="cpu", contract=contract)
    yield m
    m.close()


def test_a_missing_context_is_an_error_naming_the_slot_and_the_opt_in(model):
    with pytest.raises(InputError, match=r"^context None: no context given; .*Contract\(no_context=True\)"):
        model.score("p", None, CANDS[0])
    out = model.score_batch([("p", CTX, CANDS[0]), ("p", None, CANDS[1])], errors="return")
    assert math.isfinite(out[0].reward) and isinstance(out[1], InputError) and "no_context=True" in str(out[1])
    with pytest.raises(InputError, match="no candidate given"):
        model.score("p", CTX, None)


@pytest.mark.transformers_forward
def test_no_context_rewards_equal_the_reference_with_zero_context_images(open_model, tiny_bundle):
    from nvrm.fidelity.reference import ReferenceScorer

    ref = ReferenceScorer(tiny_bundle, contract=open_model.contract)
    want = [ref.reward(ref.inputs("p", [], list(prepare_input(c, "candidate", open_model.contract).images))) for c in CANDS]
    alone = [open_model.score("p", None, c) for c in CANDS]
    assert [r.reward for r in alone] == want
    assert [r.reward for r in open_model.score_group("p", None, CANDS)] == want  # one text prefix, prefilled once
    assert [r.reward for r in open_model.score_batch([("p", None, c) for c in CANDS])] == want
    assert all(r.off_contract == ("no context",) and r.context_times == () for r in alone)


def test_the_opt_in_changes_the_fingerprint_and_leaves_contexts_on_contract(open_model, model):
    assert open_model.fingerprint != model.fingerprint
    assert Contract().to_dict() == {k: v for k, v in Contract(no_context=True).to_dict().items() if k != "no_context"}
    with_ctx = open_model.score("p", CTX, CANDS[0])
    assert with_ctx.off_contract == () and with_ctx.reward == model.score("p", CTX, CANDS[0]).reward


def test_flow_grpo_prompts_without_a_context_video(open_model, model, tiny_bundle):
    import torch

    from nvrm.rl import flow_grpo_reward

    videos = torch.stack([torch.from_numpy(c.numpy()).permute(0, 3, 1, 2).float() / 255 for c in CANDS])  # [B, T, C, H, W] in [0, 1]
    meta = [{"fps": 1}] * 3  # a text-to-video prompt set: no context video
    with pytest.raises(RewardFnError, match=r"'context_video'.*no_context=True"):
        flow_grpo_reward(model)("cpu")(videos, ["p"] * 3, meta)
    scores, info = flow_grpo_reward(str(tiny_bundle), no_context=True)("cpu")(videos, ["p"] * 3, meta)
    assert info["nvrm_failed"] == [] and info["nvrm_off_contract"] == [["no context"]] * 3
    assert scores == [r.reward for r in open_model.score_group("p", None, CANDS)]
    assert flow_grpo_reward(open_model, no_context=True)("cpu")(videos, ["p"] * 3, meta)[0] == scores
    with pytest.raises(ConfigError, match=r"no_context=True, but the model given was loaded without it"):
        flow_grpo_reward(model, no_context=True)("cpu")


def test_trl_and_verl_rows_without_a_context(open_model, model):
    from nvrm.rl import trl_reward, verl_compute_score

    def render(prompt, completion, **row):
        return CANDS[int(completion)]

    want = [r.reward for r in open_model.score_group("p", None, CANDS[:2])]
    with pytest.raises(ConfigError, match="context_key='context_video' is not among the columns"):
        trl_reward(model, render=render)(["p", "p"], ["0", "1"])
    assert trl_reward(open_model, render=render, no_context=True)(["p", "p"], ["0", "1"]) == want  # no context column
    fn = verl_compute_score(open_model, render=render, no_context=True)
    out = fn.batch(["video"] * 2, ["0", "1"], [None] * 2, [{"prompt": "p"}] * 2)
    assert [o["score"] for o in out] == want and all(o["nvrm_off_contract"] == 1.0 for o in out)
    with pytest.raises(RewardFnError, match=r"extra_info\['context_video'\].*no_context=True"):
        verl_compute_score(model, render=render).batch(["video"], ["0"], [None], [{"prompt": "p"}])
