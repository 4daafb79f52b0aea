"""The preprocessing engine: one place for the contract and encoding, threads or processes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import echo_job, exit_job, exit_once_job
from nvrm import Clip, Contract, ContractError, InputError
from nvrm.engine import Engine, PixelCodec
from nvrm.engine.workers import to_numpy, to_torch
from nvrm.engine.workers import Workers
from nvrm.errors import InternalError
from nvrm.video.inputs import prepare_input
from nvrm.synth.clips import moving_square

CTX = Clip(moving_square(16, 96, 128, seed=1), fps=4)
SIZES = [(96, 128), (64, 80), (120, 90), (200, 48)]
CANDS = [Clip(moving_square(24, *sz, seed=10 + i, speed=1 + i), fps=4) for i, sz in enumerate(SIZES)]
SHORT = Clip(moving_square(8, 96, 128, seed=9), fps=4)  # 2 s: too short for a candidate


@pytest.fixture(scope="module")
def engines(tiny_bundle):
    made = {kind: Engine.for_bundle(tiny_bundle, workers=2, kind=kind) for kind in ("thread", "process")}
    made["inline"] = Engine.for_bundle(tiny_bundle, workers=0)
    yield made
    for e in made.values():
        e.close()


def same_video(a, b) -> bool:
    return (
        a.times == b.times
        and a.source == b.source
        and torch.equal(a.pixels, b.pixels)
        and torch.equal(a.grid, b.grid)
        and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a.images, b.images))
    )


def test_codec_reproduces_the_processor_bit_for_bit(model):
    codec = PixelCodec.for_processor(model.processor, model.contract.min_pixels, model.contract.max_pixels)
    assert codec is not None
    rng = np.random.default_rng(3)
    for h, w in [(192, 352), (352, 192), (224, 224), (32, 1024)]:  # landscape, portrait, square, extreme
        images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for _ in range(2)]
        ref = model.processor.image_processor(images=images, return_tensors="pt", min_pixels=1024, max_pixels=76800)
        patches, grid = codec.encode(images)
        assert patches.dtype == torch.uint8 and patches.shape[1] == 3 * 16 * 16  # 8x fewer bytes than the float32 pair
        assert torch.equal(grid, ref["image_grid_thw"])
        assert torch.equal(codec.to_pixel_values(patches), ref["pixel_values"])


def test_codec_is_refused_when_it_cannot_match(model):
    # a contract whose bounds make the processor resize again cannot use the codec
    class Odd:
        image_processor = dataclasses.make_dataclass("IP", [])()

    assert PixelCodec.for_processor(Odd(), 1024, 76800) is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_workers_prepare_exactly_what_inline_prepares(engines, kind):
    videos = [engines[kind].submit_video(c, "candidate") for c in CANDS]
    ref = [engines["inline"].prepare(c, "candidate") for c in CANDS]
    assert all(same_video(f.result(), r) for f, r in zip(videos, ref))
    item = engines[kind].prepare_item("a prompt", CTX, CANDS[1])
    want = engines["inline"].prepare_item("a prompt", CTX, CANDS[1])
    for name in ("input_ids", "positions", "pixels", "image_grid_thw"):
        assert torch.equal(getattr(item.encoded, name), getattr(want.encoded, name)), name


@pytest.mark.parametrize("kind", ["thread", pytest.param("process", marks=pytest.mark.slow)])  # process: workers start (~20 s)
def test_group_errors_stay_in_their_slots(engines, kind):
    engine = engines[kind]
    group = engine.prepare_group("p", CTX, [CANDS[0], SHORT, "/nonexistent.mp4", CANDS[2]])
    assert group.good == [0, 3]
    assert isinstance(group.slot_error(1), ContractError) and "2.00 s" in str(group.slot_error(1))
    assert isinstance(group.slot_error(2), InputError) and "file not found" in str(group.slot_error(2))
    assert len(group.encoded.ids) == 2 and group.encoded.prefix_len > 0
    bad_ctx = engine.prepare_group("p", "/nonexistent.mp4", CANDS[:2])
    assert bad_ctx.good == [] and bad_ctx.encoded is None
    assert all("context /nonexistent.mp4: file not found" == str(bad_ctx.slot_error(i)) for i in range(2))


def test_a_prompt_with_a_vision_token_fails_every_slot(engines):
    group = engines["thread"].prepare_group("look <|image_pad|> here", CTX, CANDS[:2])
    assert group.good == [] and isinstance(group.error, InputError)
    assert "vision token '<|image_pad|>'" in str(group.slot_error(0))


def test_group_encoding_matches_items(engines):
    engine = engines["inline"]
    group = engine.prepare_group("p", CTX, CANDS)
    for g, cand in enumerate(CANDS):
        item = engine.prepare_item("p", CTX, cand).encoded
        assert torch.equal(group.encoded.ids[g], item.input_ids)
        assert torch.equal(group.encoded.positions[g], item.positions)


def test_clip_on_a_tensor_copies_only_sampled_frames():
    frames = torch.from_numpy(moving_square(40, 32, 48, seed=4))
    clip = Clip(frames, fps=8)
    assert clip.frames is frames  # kept as given (a GPU tensor would stay on the GPU)
    a = prepare_input(clip, "candidate", Contract())
    b = prepare_input(Clip(frames.numpy(), fps=8), "candidate", Contract())
    assert a.times == b.times and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a.images, b.images))
    assert clip.take([0, 8]).shape == (2, 32, 48, 3)


def test_results_survive_the_process_boundary(engines):
    video = engines["inline"].prepare(CANDS[0], "candidate")
    back = to_torch(to_numpy(video))
    assert isinstance(to_numpy(video).pixels, np.ndarray)
    assert same_video(back, video)


@pytest.mark.slow
def test_a_worker_process_that_dies_is_replaced_and_its_job_retried(tiny_bundle, tmp_path):
    engine = Engine.for_bundle(tiny_bundle, workers=1, kind="process")
    try:
        workers: Workers = engine._workers
        pid = workers.submit(echo_job, 1).result()[1]
        assert workers.submit(exit_once_job, str(tmp_path / "marker")).result() == "second try"
        value, pid2 = workers.submit(echo_job, 2).result()
        assert value == 2 and pid2 != pid  # a new worker took over
        with pytest.raises(InternalError, match="worker process died"):
            workers.submit(exit_job, 5).result()
        assert engine.prepare(CANDS[0], "candidate").times == (0.0, 1.0, 2.0, 3.0, 4.0)  # still serving
    finally:
        engine.close()


def test_closed_engine_refuses_work(tiny_bundle):
    engine = Engine.for_bundle(tiny_bundle, workers=1, kind="thread")
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit_video(CANDS[0], "candidate")
