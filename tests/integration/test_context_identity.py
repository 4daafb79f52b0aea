"""One context identity, by content, in every RL adapter (issue 37, item 5).

TRL hands each completion of a prompt its own copy of the dataset row, so an image context arrives as
equal but distinct arrays; verl's extra_info and flow-GRPO's metadata can do the same. Copies of one
context are one context: they form one group, share one prefill, and under ``on_error="group_mean"``
a failed slot gets its own prompt's mean, never the mean of the whole call.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import in_threads
from nvrm import make_reward_fn
from nvrm.rl import flow_grpo_reward, trl_reward, verl_compute_score

ONE, TWO = "A square glides across a tiled floor.", "A square drifts slowly to the left."
MISSING = "/no/such/video.mp4"


@pytest.fixture(scope="module")
def case(model, clips):
    """Two prompts, each with its own image context handed in as a fresh copy per item, and one failed slot each;
    with the rewards each slot must get (a failed slot: its own prompt's scored mean)."""
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for _ in range(2)]
    videos = [str(clips["cand_a"]), MISSING, str(clips["cand_b"]), str(clips["cand_b"]), str(clips["context"]), MISSING]
    prompts = [ONE] * 3 + [TWO] * 3
    contexts = [images[0].copy() for _ in range(3)] + [images[1].copy() for _ in range(3)]
    g1 = [r.reward for r in model.score_group(ONE, images[0], [videos[0], videos[2]])]
    g2 = [r.reward for r in model.score_group(TWO, images[1], [videos[3], videos[4]])]
    want = [g1[0], sum(g1) / 2, g1[1], g2[0], g2[1], sum(g2) / 2]
    overall = sum(g1 + g2) / 4
    assert abs(want[1] - overall) > 1e-4 and abs(want[5] - overall) > 1e-4  # the case tells the two means apart
    return prompts, contexts, videos, want


def _spy_groups(model, monkeypatch) -> list[int]:
    """The size of every group the model scores with one shared prefill."""
    sizes: list[int] = []
    real = model.score_groups
    monkeypatch.setattr(model, "score_groups", lambda gs, **k: real([g for g in gs if sizes.append(len(g[2])) or True], **k))
    return sizes


def test_make_reward_fn_fills_a_failed_slot_with_its_own_prompts_mean(model, case, monkeypatch):
    prompts, contexts, videos, want = case
    sizes = _spy_groups(model, monkeypatch)
    assert make_reward_fn(model, on_error="group_mean")(prompts, contexts, videos) == want
    assert sizes == [3, 3]  # the copies of each image share one prefill


def test_trl_reward_fills_a_failed_slot_with_its_own_prompts_mean(model, case, monkeypatch):
    prompts, contexts, videos, want = case
    sizes = _spy_groups(model, monkeypatch)
    fn = trl_reward(model, on_error="group_mean")
    assert fn(prompts=prompts, completions=videos, context_video=contexts) == want  # TRL's call: one row copy per completion
    assert sizes == [2, 2]  # a completion that names no file is refused before scoring


def test_verl_batch_fills_a_failed_slot_with_its_own_prompts_mean(model, case):
    prompts, contexts, videos, want = case
    infos = [{"prompt": p, "context_video": c} for p, c in zip(prompts, contexts)]
    out = verl_compute_score(model, on_error="group_mean").batch(["v"] * 6, videos, [None] * 6, infos)
    assert [o["score"] for o in out] == want
    assert [o["nvrm_ok"] for o in out] == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]


def test_verl_per_sample_calls_fill_a_failed_slot_with_its_own_prompts_mean(model, case, monkeypatch):
    """verl 0.9's reward loop: one compute_score call per sample, from many threads, coalesced into one call."""
    prompts, contexts, videos, want = case
    sizes = _spy_groups(model, monkeypatch)
    fn = verl_compute_score(model, on_error="group_mean", coalesce_ms=1500)
    out: list = [None] * 6

    def one(i: int) -> None:
        info = {"prompt": prompts[i], "context_video": contexts[i]}
        out[i] = fn(data_source="v", solution_str=videos[i], ground_truth=None, extra_info=info)

    in_threads(one, 6)
    assert [o["score"] for o in out] == want
    assert sorted(sizes) == [2, 2]  # every sample arrived within the window: one call, two groups


def test_flow_grpo_fills_a_failed_slot_with_its_own_prompts_mean(model, case, monkeypatch):
    prompts, contexts, videos, want = case
    sizes = _spy_groups(model, monkeypatch)
    scores, info = flow_grpo_reward(model, on_error="group_mean")("cpu")(videos, prompts, [{"context_video": c} for c in contexts])
    assert info["nvrm_failed"] == [1, 5]
    assert scores == want
    assert sizes == [3, 3]
