"""Off-contract rewards are flagged on every path, and the differentiable reward's edges (issue 33, items
14-17): the differentiable reward and refl_reward report the opt-ins they used, pre-sampled candidate
frames off the 1 FPS ticks are flagged, a batch of no candidates is a one-line error, and the weights get
no gradient even when a caller switched requires_grad on."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from nvrm.errors import InputError


@pytest.fixture(scope="module")
def short_model(tiny_bundle):
    from nvrm import Contract, RewardModel

    with RewardModel.from_pretrained(tiny_bundle, contract=Contract(short_candidates=True)) as m:
        yield m


def test_the_differentiable_reward_and_refl_report_the_opt_ins_they_used(short_model, clips, caplog):
    from nvrm.rl import refl_reward

    scorer = short_model.differentiable(checkpointing=False)
    frames = torch.rand(2, 24, 3, 64, 96)  # 3 s at 8 fps: short candidates
    full = torch.rand(1, 48, 3, 64, 96)
    with caplog.at_level(logging.WARNING, logger="nvrm.scoring.differentiable"):
        scorer("p", clips["context"], frames, fps=8.0)
        scorer("p", clips["context"], frames, fps=8.0)
    assert scorer.off_contract == [("short candidate: 3 of 5 frames",)] * 2
    assert sum("short candidate" in r.message for r in caplog.records) == 1  # once per reason, not per call
    scorer("p", clips["context"], full, fps=8.0)
    assert scorer.off_contract == [()]
    fn = refl_reward(short_model, fps=8.0)
    fn(torch.cat([full, full]), ["p", "q"], [clips["context"], clips["context"]])
    assert fn.off_contract == [[], []]
    fn(torch.rand(2, 24, 3, 64, 96), ["p", "p"], [clips["context"], clips["context"]])
    assert fn.off_contract == [["short candidate: 3 of 5 frames"]] * 2


def test_a_batch_of_no_candidates_is_a_one_line_error(model, clips):
    scorer = model.differentiable()
    with pytest.raises(InputError, match=r"a batch of no candidates"):
        scorer("p", clips["context"], torch.rand(0, 48, 3, 64, 96), fps=8.0)


def test_weights_switched_to_requires_grad_still_get_no_gradient(tiny_bundle, clips, caplog):
    from nvrm import RewardModel

    with RewardModel.from_pretrained(tiny_bundle) as m:
        scorer = m.differentiable(checkpointing=False)
        params = list(m.backbone.parameters()) + list(m.head.parameters())
        for p in params:
            p.requires_grad_(True)  # a caller "helpfully" unfreezing the model
        frames = torch.rand(1, 48, 3, 64, 96, requires_grad=True)
        with caplog.at_level(logging.WARNING, logger="nvrm.scoring.differentiable"):
            scorer("p", clips["context"], frames, fps=8.0).sum().backward()
        assert frames.grad is not None and float(frames.grad.abs().sum()) > 0
        assert all(p.grad is None for p in params)
        assert any("requires_grad off again" in r.message for r in caplog.records)


def test_presampled_candidate_frames_off_the_ticks_are_flagged(model):
    from helpers import InProcessServer
    from nvrm.protocol import npy_bytes
    from nvrm.synth.clips import moving_square

    frames = moving_square(5, 64, 96, seed=3)
    fp = model.contract.fingerprint
    server = InProcessServer(model)
    try:
        def post(times):
            payload = {"prompt": "p", "context": {"part": "f", "times": [0.0, 1.0, 2.0, 3.0, 4.0], "sampled": fp},
                       "candidates": [{"part": "f", "times": times, "sampled": fp}]}
            files = [("request", (None, json.dumps(payload), "application/json")), ("f", ("f", npy_bytes(frames), "application/octet-stream"))]
            r = server.post("/v1/score_group", files=files)
            assert r.status_code == 200, r.text
            return r.json()["results"][0]

        on_ticks = post([0.0, 1.0, 2.0, 3.0, 4.0])
        assert not on_ticks.get("off_contract")
        near = post([0.0, 1.05, 1.98, 3.1, 4.0])  # a source's nearest frames: on the plan
        assert not near.get("off_contract")
        off = post([0.0, 0.1, 0.2, 0.3, 0.4])
        assert off["off_contract"] == ["candidate frames off the 1 FPS ticks (at 0, 0.1, 0.2, 0.3, 0.4 s)"]
    finally:
        server.stop()
