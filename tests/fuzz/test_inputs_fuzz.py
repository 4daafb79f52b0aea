"""Property-based sweep over in-memory clips: any shape, frame rate and role ends in prepared frames
or an NvrmError naming the input, within bounded work. Run with `make fuzz` (pytest -m fuzz)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvrm import Clip, Contract
from nvrm.errors import NvrmError
from nvrm.video.inputs import prepare_input

pytestmark = pytest.mark.fuzz
C = Contract()

fps_values = st.one_of(
    st.floats(min_value=1e-320, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -1.0, math.inf, math.nan, 1e-308, 1e-3, 0.1, 1.0, 8.0, 1000.0, 1e5]),
)


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(
    t=st.integers(min_value=0, max_value=40),
    h=st.integers(min_value=1, max_value=64),
    w=st.integers(min_value=1, max_value=64),
    fps=fps_values,
    role=st.sampled_from(["context", "candidate"]),
)
def test_clips_prepare_or_fail_cleanly(t, h, w, fps, role):
    frames = np.zeros((t, h, w, 3), np.uint8)
    try:
        video = prepare_input(Clip(frames, fps=fps), role, C)
    except NvrmError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert len(video.images) == len(video.times) >= 1
    assert all(im.mode == "RGB" for im in video.images)


@settings(max_examples=100, deadline=2000)
@given(shape=st.lists(st.integers(min_value=0, max_value=6), min_size=0, max_size=5), dtype=st.sampled_from(["uint8", "float32", "int16", "bool"]))
def test_any_array_as_a_clip_is_accepted_or_refused_by_name(shape, dtype):
    try:
        Clip(np.zeros(shape, dtype=dtype), fps=4, name="fuzz")
    except NvrmError as e:
        assert str(e).startswith("fuzz: ")
