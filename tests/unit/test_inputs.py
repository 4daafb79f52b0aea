import numpy as np
import pytest
import torch
from PIL import Image

from nvrm import Clip, Contract, ContractError, InputError
from nvrm.video.inputs import prepare_input, sample_input
from nvrm.synth.clips import moving_square

C = Contract()


def test_clip_samples_by_frame_time():
    frames = moving_square(48, 64, 80)
    images, plan, name = sample_input(Clip(frames, fps=8), "candidate", C)
    assert plan.indices == (0, 8, 16, 24, 32)
    assert [np.asarray(im)[0, 0, 0] for im in images] == [0, 8, 16, 24, 32]


def test_torch_and_numpy_clips_are_identical():
    frames = moving_square(12, 64, 80)
    a = prepare_input(Clip(frames, fps=2), "context", C)
    b = prepare_input(Clip(torch.from_numpy(frames), fps=2), "context", C)
    assert a.times == b.times == (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a.images, b.images))


@pytest.mark.parametrize(
    "frames,fps,needle",
    [
        (np.zeros((4, 8, 8, 3), np.float32), 1, "uint8"),
        (np.zeros((4, 8, 8), np.uint8), 1, "(T, H, W, 3)"),
        (np.zeros((0, 8, 8, 3), np.uint8), 1, "zero frames"),
        (np.zeros((4, 8, 8, 3), np.uint8), 0, "fps"),
    ],
)
def test_bad_clips(frames, fps, needle):
    with pytest.raises(InputError) as e:
        Clip(frames, fps=fps)
    assert needle in str(e.value)


def test_image_list_is_one_frame_per_second():
    imgs = [Image.fromarray(f) for f in moving_square(6, 64, 80)]
    images, plan, _ = sample_input(imgs, "candidate", C)
    assert plan.indices == (0, 1, 2, 3, 4)
    with pytest.raises(ContractError, match="candidate is 4.00 s"):
        sample_input(imgs[:4], "candidate", C)


def test_single_image_is_one_frame_context():
    img = Image.fromarray(moving_square(1, 64, 80)[0])
    for value in (img, np.asarray(img)):
        prepared = prepare_input(value, "context", C)
        assert prepared.times == (0.0,) and len(prepared.images) == 1


def test_errors_name_role_and_input():
    with pytest.raises(InputError) as e:
        prepare_input("/nonexistent/clip.mp4", "candidate", C)
    assert str(e.value) == "candidate /nonexistent/clip.mp4: file not found"
    with pytest.raises(InputError, match="needs its frame rate"):
        prepare_input(np.zeros((3, 8, 8, 3), np.uint8), "context", C)
    with pytest.raises(InputError, match="unsupported input"):
        prepare_input(42, "context", C)
