"""The one input-identity rule (``nvrm.source.identity``): equal content is one input, whatever carries it (pure)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image

from nvrm import Clip
from nvrm.source.identity import all_same, input_key, input_keys, same_input
from nvrm.rl.scorer import context_key, group_items

RNG = np.random.default_rng(3)
FRAMES = RNG.integers(0, 256, (4, 12, 16, 3), dtype=np.uint8)


def _one_pixel_off(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b.reshape(-1)[-1] ^= 1  # the very last byte: no shortcut on a prefix
    return b


EQUAL = [
    ("array copy", FRAMES[0], FRAMES[0].copy()),
    ("non-contiguous array", FRAMES[0][:, ::2], np.ascontiguousarray(FRAMES[0][:, ::2])),
    ("bytes and bytearray", b"video-bytes", bytearray(b"video-bytes")),
    ("bytes and memoryview", b"video-bytes", memoryview(b"video-bytes")),
    ("clip copy", Clip(FRAMES, 8), Clip(FRAMES.copy(), 8.0, name="another name")),
    ("clip of numpy and of a tensor", Clip(FRAMES, 8), Clip(torch.from_numpy(FRAMES.copy()), 8)),
    ("tensor copy", torch.from_numpy(FRAMES[0]), torch.from_numpy(FRAMES[0]).clone()),
    ("image list copy", [FRAMES[0], FRAMES[1]], (FRAMES[0].copy(), FRAMES[1].copy())),
    ("PIL image copy", Image.fromarray(FRAMES[0]), Image.fromarray(FRAMES[0].copy())),
    ("none", None, None),
]

DIFFERENT = [
    ("array content", FRAMES[0], _one_pixel_off(FRAMES[0])),
    ("array shape", FRAMES[0], FRAMES[0].reshape(16, 12, 3)),
    ("array dtype", FRAMES[0], FRAMES[0].view(np.int8)),
    ("bytes content", b"video-bytes", b"video-bytez"),
    ("clip fps", Clip(FRAMES, 8), Clip(FRAMES, 16)),
    ("clip frames", Clip(FRAMES, 8), Clip(_one_pixel_off(FRAMES), 8)),
    ("tensor dtype", torch.zeros(4, 4), torch.zeros(4, 4, dtype=torch.float64)),
    ("tensor content", torch.from_numpy(FRAMES[0]), torch.from_numpy(_one_pixel_off(FRAMES[0]))),
    ("array and tensor", FRAMES[0], torch.from_numpy(FRAMES[0])),
    ("array and clip", FRAMES, Clip(FRAMES, 8)),
    ("image order", [FRAMES[0], FRAMES[1]], [FRAMES[1], FRAMES[0]]),
    ("PIL mode", Image.fromarray(FRAMES[0]), Image.fromarray(FRAMES[0]).convert("RGBA")),
    ("none and empty bytes", None, b""),
    ("two objects", object(), object()),
]


@pytest.mark.parametrize("name, a, b", EQUAL, ids=[e[0] for e in EQUAL])
def test_equal_content_is_one_input(name, a, b):
    assert input_key(a) == input_key(b)
    assert same_input(a, b) and all_same([a, b, a])
    assert len(set(input_keys([a, b]))) == 1


@pytest.mark.parametrize("name, a, b", DIFFERENT, ids=[e[0] for e in DIFFERENT])
def test_different_content_shape_or_dtype_is_another_input(name, a, b):
    assert input_key(a) != input_key(b)
    assert not same_input(a, b) and not all_same([a, b])
    assert len(set(input_keys([a, b]))) == 2


def test_a_path_is_the_file_it_resolves_to(tmp_path, monkeypatch):
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"not really a video")
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.mp4"
    link.symlink_to(video)
    monkeypatch.chdir(tmp_path / "sub")
    spellings = [str(video), video, "../clip.mp4", os.path.join(str(tmp_path), "sub", "..", "clip.mp4"), str(link)]
    assert len({input_key(s) for s in spellings}) == 1
    assert all_same(spellings)
    other = tmp_path / "other.mp4"
    other.write_bytes(b"not really a video")  # the same bytes in another file: another path
    assert input_key(other) != input_key(video) and not same_input(other, video)


BIG = RNG.integers(0, 256, (15, 36, 64, 3), dtype=np.uint8)  # 100 KiB: more than the 64 KiB sample


def test_a_difference_outside_the_hashed_sample_still_parts_two_inputs():
    other = BIG.copy()
    other.reshape(-1)[5000] ^= 1  # between the first and the second 4 KiB slice of the sample
    assert input_key(BIG) != input_key(other) and not same_input(Clip(BIG, 4), Clip(other, 4))
    assert hash(input_key(BIG)) == hash(input_key(other))  # the sample agrees: the full comparison decides


def test_copies_cost_one_comparison_each_and_different_contexts_none(monkeypatch):
    import nvrm.source.identity as identity

    compared = []
    real = identity._same_bytes
    monkeypatch.setattr(identity, "_same_bytes", lambda a, b: compared.append(1) or real(a, b))
    assert group_items(["p"] * 8, [Clip(BIG.copy(), 4) for _ in range(8)]) == [list(range(8))]
    assert len(compared) == 7  # each copy against the first, once
    compared.clear()
    different = [Clip(RNG.integers(0, 256, BIG.shape, dtype=np.uint8), 4) for _ in range(8)]
    assert group_items(["p"] * 8, different) == [[i] for i in range(8)]
    assert compared == []  # they part on the sample


def test_grouping_uses_the_rule_and_the_prompt():
    copies = [FRAMES.copy() for _ in range(3)]
    contexts = [Clip(c, 4) for c in copies] + [Clip(FRAMES, 4), Clip(_one_pixel_off(FRAMES), 4)]
    assert group_items(["p", "p", "q", "p", "p"], contexts) == [[0, 1, 3], [2], [4]]
    assert context_key("p", copies[0]) == context_key("p", copies[1]) != context_key("q", copies[0])
