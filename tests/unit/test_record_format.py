"""The rollout record's pure parts: keys, paths, rows, the sampling draw, the header check."""

import json

import numpy as np
import pytest

from nvrm.record import format as fmt


def frames(seed, t=3):
    return np.random.default_rng(seed).integers(0, 255, (t, 8, 6, 3), dtype=np.uint8)


def test_equal_frames_share_a_key_and_any_change_makes_another():
    a = frames(0)
    k = fmt.frames_key(a, [0.0, 1.0, 2.0])
    assert k == fmt.frames_key(a.copy(), [0.0, 1.0, 2.0])
    b = a.copy()
    b[1, 2, 3, 0] ^= 1
    assert len({k, fmt.frames_key(b, [0, 1, 2]), fmt.frames_key(a, [0, 1, 2.5]), fmt.frames_key(a.reshape(3, 6, 8, 3), [0, 1, 2])}) == 4


@pytest.mark.parametrize("kind", ["contexts", "candidates"])
def test_paths_are_relative_and_fanned_out(kind):
    key = "ab" + "0" * 62
    assert fmt.frames_path(kind, key) == f"{kind}/ab/{key}.npy"


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        fmt.frames_path("videos", "ab")


def test_segments_sort_oldest_first():
    names = [fmt.segment_name(n) for n in (0, 9, 10, 256, 100000)]
    assert names == sorted(names)


@pytest.mark.parametrize("rate, expect", [(1.0, 1000), (0.0, 0)])
def test_rate_bounds(rate, expect):
    assert sum(fmt.sampled(rate, 0, f"g{i}") for i in range(1000)) == expect


def test_rate_is_deterministic_for_a_seed_and_near_its_share():
    keys = [f"g{i}" for i in range(4000)]
    a = [fmt.sampled(0.25, 7, k) for k in keys]
    assert a == [fmt.sampled(0.25, 7, k) for k in keys]
    assert a != [fmt.sampled(0.25, 8, k) for k in keys]
    assert 0.22 < sum(a) / len(a) < 0.28


def test_group_key_follows_prompt_and_context():
    g = fmt.group_key("serve", 3, "p", "ctx1")
    assert g == fmt.group_key("serve", 3, "p", "ctx1")
    others = {fmt.group_key("serve", 3, "q", "ctx1"), fmt.group_key("serve", 3, "p", "ctx2"), fmt.group_key("serve", 4, "p", "ctx1")}
    assert len({g} | others) == 4


def test_a_row_names_everything_and_is_json():
    ctx = fmt.frames_ref("contexts", "cd" * 32, [0.0, 1.0])
    cand = fmt.frames_ref("candidates", "ef" * 32, [0.5, 1.5])
    r = fmt.row(seq=5, time=1.23456, source="serve", group="g", index=1, prompt="p", context=ctx, candidate=cand,
                reward=-0.5, revision="rev", contract="fp")
    assert json.loads(json.dumps(r)) == r
    assert r["context"]["path"].startswith("contexts/cd/") and r["candidate"]["times"] == [0.5, 1.5] and r["time"] == 1.235
    assert fmt.row_bytes(json.dumps(r), [10, 20]) == len(json.dumps(r)) + 30


@pytest.mark.parametrize("obj, needle", [
    ({"format": "nvrm-record", "version": 1}, None),
    ({"format": "other", "version": 1}, "not an nvrm record"),
    ({"format": "nvrm-record", "version": 2}, "version 2"),
    ([], "not an nvrm record"),
])
def test_header_check(obj, needle):
    problem = fmt.check_header(obj)
    assert (problem is None) if needle is None else (needle in problem)
    assert fmt.check_header(json.loads(fmt.header())) is None
