"""The runtime equals a plain reference implementation of the contract, exactly."""


import numpy as np
import pytest
import torch

from nvrm import Clip
from nvrm.synth.clips import moving_square, write_video
from nvrm.engine.tasks import item_job
from nvrm.fidelity.reference import ReferenceScorer, reference_images
from nvrm.fidelity.numerics import BATCH_DRIFT_ULPS, bf16_ulp, ulps


@pytest.fixture(scope="module")
def reference(tiny_bundle):
    return ReferenceScorer(tiny_bundle)




@pytest.mark.transformers_forward
@pytest.mark.parametrize("prompt", ["A person walks down the street.", "Ein Hund läuft — 街道上的行人 🚶"])
def test_tensors_and_reward_match_reference(model, reference, clips, prompt):
    prepared = model.prepare(prompt, clips["context"], clips["cand_a"])
    ctx, ctx_times = reference_images(clips["context"], "context", model.contract)
    cand, cand_times = reference_images(clips["cand_a"], "candidate", model.contract)
    ref_inputs = reference.inputs(prompt, ctx, cand)

    assert prepared.context.times == tuple(ctx_times)
    assert prepared.candidate.times == tuple(cand_times) == (0.0, 1.0, 2.0, 3.0, 4.0)
    assert torch.equal(prepared.encoded.input_ids, ref_inputs["input_ids"][0])
    assert torch.equal(prepared.encoded.image_grid_thw, ref_inputs["image_grid_thw"])
    assert torch.equal(prepared.encoded.pixel_values, ref_inputs["pixel_values"])

    ours = model.score(prompt, clips["context"], clips["cand_a"]).reward
    assert ours == reference.reward(ref_inputs)


def test_processor_gets_contract_pixel_bounds(model):
    """The bundle's processor defaults (shortest_edge 65,536) would resize a second time."""
    from PIL import Image

    assert model.processor.image_processor.size["shortest_edge"] == 65536  # the release-style trap is present
    from nvrm.engine.chat import images_kwargs

    frames = [Image.fromarray(np.full((64, 864, 3), 128, np.uint8))] * 5  # already contract-sized
    out = model.processor(text=["<|image_pad|>"], images=frames[:1], return_tensors="pt", images_kwargs=images_kwargs(model.contract))
    assert out["image_grid_thw"][0].tolist() == [1, 4, 54]
    patches, grid = model.engine.codec.encode(frames[:1])  # what the workers ship for such a frame
    assert grid[0].tolist() == [1, 4, 54]
    assert torch.equal(model.engine.codec.to_pixel_values(patches), out["pixel_values"])
    default = model.processor(text=["<|image_pad|>"], images=frames[:1], return_tensors="pt")
    assert default["image_grid_thw"][0].tolist() == [1, 6, 60]


@pytest.mark.slow
def test_packed_batch_equals_single(model):
    """Packed batches (nvrm.forward.model) run every row's attention alone: on the CPU, bit-identical to score."""
    items = [(f"prompt {i}", Clip(moving_square(4 * t, *size, seed=10 + i), fps=4), Clip(moving_square(24, *size, seed=20 + i, speed=5), fps=4))
             for i, (t, size) in enumerate([(3, (64, 80)), (9, (96, 128)), (1, (48, 200)), (6, (120, 90))])]
    assert model.packed
    got = model.score_batch(items)
    assert len({r.num_tokens for r in got}) == len(items)  # every row a different length
    assert [r.reward for r in got] == [model.score(*it).reward for it in items]


@pytest.mark.slow
def test_batch_equals_single_within_the_measured_tolerance(model):
    items = []
    for i, (t_ctx, size) in enumerate([(3, (64, 80)), (9, (96, 128)), (1, (48, 200)), (6, (120, 90))]):
        ctx = Clip(moving_square(t_ctx * 4, *size, seed=10 + i), fps=4)
        cand = Clip(moving_square(24, *size, seed=20 + i, speed=5), fps=4)
        items.append((f"prompt {i}", ctx, cand))
    single = [model.score(*it).reward for it in items]
    batched = [r.reward for r in model.score_batch(items)]
    lengths = {r.num_tokens for r in model.score_batch(items)}
    assert len(lengths) > 1  # padding is really exercised
    for s, b in zip(single, batched):
        assert abs(s - b) <= BATCH_DRIFT_ULPS * bf16_ulp(s)


def test_different_candidates_get_different_rewards(model, clips):
    """Candidates far apart in content get rewards far apart in ulps, so no CPU's rounding can merge them.
    (Two moving squares are only 1-2 ulps apart on the tiny bundle: whether they differ is rounding luck.)"""
    black = Clip(np.zeros((48, 96, 128, 3), np.uint8), fps=8)
    white = Clip(np.full((48, 96, 128, 3), 255, np.uint8), fps=8)
    a = model.score("p", clips["context"], black).reward
    b = model.score("p", clips["context"], white).reward
    assert ulps(a, b) >= 16, (a, b)


def test_clip_and_encoded_file_agree_for_lossless_video(model, tmp_path):
    """A world model's in-memory frames give the same reward as the same frames in a lossless file."""
    frames = moving_square(48, 96, 128, seed=5)
    path = write_video(tmp_path / "lossless.mkv", frames, 8, codec="ffv1", pix_fmt="bgr0")
    ctx = Clip(moving_square(16, 96, 128, seed=6), fps=8)
    assert model.score("p", ctx, Clip(frames, fps=8)).reward == model.score("p", ctx, path).reward


def test_encoding_in_worker_threads_is_bit_identical(model, clips):
    """Every pool thread tokenises and normalises with its own processor copy."""
    items = [("p", clips["context"], clips[k]) for k in ("cand_a", "cand_b")] * 6
    inline = [model.engine._workers.run_inline(item_job, *it).encoded for it in items]
    jobs = [model.engine.submit_item(*it) for it in items]
    threaded = [f.result().encoded for f in jobs]
    assert model.engine.kind == "thread" and model.engine.workers >= 1
    for a, b in zip(inline, threaded):
        assert torch.equal(a.input_ids, b.input_ids)
        assert torch.equal(a.pixel_values, b.pixel_values)
        assert torch.equal(a.image_grid_thw, b.image_grid_thw)
