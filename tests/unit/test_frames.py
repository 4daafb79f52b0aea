import numpy as np
import pytest
from PIL import Image
from qwen_vl_utils import fetch_image

from nvrm import Contract, ContractError
from nvrm.video.frames import check_encodable, contract_size, jpeg_roundtrip, prepare_frame

C = Contract()


def _image(w, h, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("size", [(176, 144), (1920, 1080), (3840, 2160), (720, 1280), (128, 96), (1000, 14), (16, 3000)])
def test_prepare_frame_equals_reference_fetch_image(size):
    img = _image(*size)
    ours = prepare_frame(img, C)
    w, h = img.size
    ref = img.resize((round(w * 360 / h), 360), Image.BICUBIC)
    ref = jpeg_roundtrip(ref, 85)
    ref = fetch_image({"image": ref, "min_pixels": 1024, "max_pixels": 76800}, image_patch_size=16)
    assert ours.size == ref.size
    assert np.array_equal(np.asarray(ours), np.asarray(ref))
    assert ours.width % 32 == 0 and ours.height % 32 == 0
    assert 1024 <= ours.width * ours.height <= 76800


def test_jpeg_roundtrip_is_lossy_and_quality_85():
    img = _image(64, 64)
    a = np.asarray(jpeg_roundtrip(img, 85)).astype(int)
    b = np.asarray(jpeg_roundtrip(img, 95)).astype(int)
    assert not np.array_equal(a, np.asarray(img)) and not np.array_equal(a, b)


@pytest.mark.parametrize(
    "w,h,needle",
    [
        (3200, 16, "aspect ratio 200.0:1"),  # exactly 200 is fine for qwen-vl-utils, but too wide for JPEG
        (3300, 16, "at most 200:1"),
        (16, 3300, "at most 200:1"),
        (3000, 16, "over JPEG's 65535 px limit"),  # 187.5:1 -> 67,500 px at height 360
        (2900, 16, "cannot be encoded"),  # fits JPEG, but smart_resize floors the height to 0
        (1000, 10, "would make it 2752x0 px"),  # 100:1
    ],
)
def test_unencodable_frames_rejected_before_resizing(w, h, needle):
    with pytest.raises(ContractError) as e:
        check_encodable(w, h, C, "clip.mp4")
    assert needle in str(e.value) and "clip.mp4" in str(e.value)


def test_widest_encodable_landscape_frame():
    check_encodable(1000, 14, C, "x")  # 71.4:1 still gets a 32-px-high grid
    assert prepare_frame(_image(1000, 14), C).height == 32


def test_portrait_extreme_is_accepted():
    out = prepare_frame(_image(16, 3000), C)  # 1:187.5 -> 2 px wide at height 360
    assert out.width == 32


def test_contract_size_matches_known_grid():
    # 360x4860 (a 64x864 frame at height 360) is shrunk into the 76,800 pixel budget
    w, h = contract_size(4860, 360, C)
    assert w * h <= 76800 and w % 32 == 0 and h % 32 == 0


def test_rgba_is_composited_on_white_like_qwen_vl_utils():
    img = Image.new("RGBA", (64, 48), (255, 0, 0, 0))
    out = prepare_frame(img, C)
    assert np.asarray(out).mean() > 240
