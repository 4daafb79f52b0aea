"""A container whose header understates its duration cannot pass the byte budget: decoding stops at
the first frame past what the header declares (plus the truncation check's slack), and the service's
reservation covers everything up to there."""

from __future__ import annotations

import struct

import pytest

from nvrm.contract import Contract
from nvrm.errors import InputError
from nvrm.limits import Limits
from nvrm.serve.admission.budget import sampled_frames
from nvrm.synth.clips import moving_square, write_video
from nvrm.video.decode import declared_duration, read_sampled


def understated_mkv(path, seconds: int = 250, declared: float = 1.0):
    """An MKV of ``seconds`` 1 fps frames whose Segment Info says it lasts ``declared`` s."""
    path = write_video(path, moving_square(seconds, 64, 96, seed=3), fps=1)
    raw = bytearray(path.read_bytes())
    i = raw.find(b"\x44\x89")  # EBML Duration, in TimecodeScale units (ms)
    size = raw[i + 2]
    assert size in (0x84, 0x88)
    raw[i + 3 : i + (11 if size == 0x88 else 7)] = struct.pack(">d" if size == 0x88 else ">f", declared * 1000.0)
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("strategy", ["auto", "sequential"])
def test_a_context_longer_than_its_header_is_refused_at_the_bound(tmp_path, strategy):
    path = understated_mkv(tmp_path / "lie.mkv")
    assert declared_duration(str(path)) == pytest.approx(1.0)
    with pytest.raises(InputError, match="more video than its container declares: a frame at 2.00 s"):
        read_sampled(str(path), "context", Contract(), strategy=strategy)


def test_the_reservation_covers_an_honest_header(tmp_path):
    for n, fps in ((20, 1), (40, 8), (7, 2)):
        path = write_video(tmp_path / f"ok{n}.mkv", moving_square(n, 64, 96, seed=n), fps=fps)
        got = len(read_sampled(str(path), "context", Contract()).images)
        assert got <= sampled_frames(str(path), "context", Contract(), Limits()), (n, fps)


def test_the_service_refuses_it_in_the_items_slot(tmp_path, model):
    from helpers import InProcessServer
    from nvrm import Clip

    lie = understated_mkv(tmp_path / "lie.mkv").read_bytes()
    with InProcessServer(model) as s:
        r = s.client().score_group("p", lie, [Clip(moving_square(5, 64, 96, seed=2), fps=1)], errors="return")
    assert r[0].code == "invalid_input" and "declares" in r[0].detail, r
