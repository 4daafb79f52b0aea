import pytest

from nvrm import Contract, ContractError, InputError
from nvrm.video.sampling import (
    candidate_ticks,
    clip_duration,
    context_ticks,
    nearest_index,
    plan_candidate,
    plan_context,
)

C = Contract()


@pytest.mark.parametrize(
    "times,tick,expected",
    [
        ([0.0, 0.5, 1.0], 1.0, 2),  # exact hit
        ([0.0, 0.9, 1.1], 1.0, 1),  # tie -> earlier frame
        ([0.0, 0.8, 1.1], 1.0, 2),  # nearer later frame
        ([0.0, 0.4], 3.0, 1),  # past the end -> last frame
        ([0.0], 0.0, 0),
        ([0.0, 1 / 3, 2 / 3, 1.0], 0.5, 1),  # tie between 1/3 and 2/3 -> earlier
    ],
)
def test_nearest_index(times, tick, expected):
    assert nearest_index(times, tick) == expected


def test_candidate_ticks_are_first_five_seconds():
    assert candidate_ticks(C) == (0.0, 1.0, 2.0, 3.0, 4.0)


@pytest.mark.parametrize(
    "duration,expected",
    [(0.04, (0.0,)), (1.0, (0.0,)), (1.01, (0.0, 1.0)), (5.0, (0.0, 1.0, 2.0, 3.0, 4.0)), (5.5, (0.0, 1.0, 2.0, 3.0, 4.0, 5.0))],
)
def test_context_ticks_below_duration(duration, expected):
    assert context_ticks(duration, C) == expected


def test_context_cap_keeps_most_recent():
    assert context_ticks(10.0, Contract(max_context_frames=3)) == (7.0, 8.0, 9.0)


def test_duration_is_last_time_plus_mean_interval():
    assert clip_duration([0.0, 0.125, 0.25]) == pytest.approx(0.375)
    assert clip_duration([0.0], nominal_interval=0.04) == pytest.approx(0.04)


def test_candidate_plan_at_8fps():
    times = [i / 8 for i in range(48)]
    plan = plan_candidate(times, C, "x")
    assert plan.indices == (0, 8, 16, 24, 32)
    assert plan.duration == pytest.approx(6.0)


def test_short_candidate_states_both_durations():
    times = [i / 8 for i in range(32)]  # 4.0 s
    with pytest.raises(ContractError, match=r"candidate is 4\.00 s; the contract needs 5\.00 s"):
        plan_candidate(times, C, "clip.mp4")


def test_candidate_within_half_frame_interval_is_accepted():
    # 2 fps: 9 frames -> 4.5 s... needs >= 5 - 0.25; 10 frames -> 5.0 s
    ok = [i / 2 for i in range(10)]
    assert plan_candidate(ok, C, "x").indices == (0, 2, 4, 6, 8)
    # 24 fps, one frame short: 4.958 s is within half an interval (0.0208 s)? No: short by 0.0417.
    with pytest.raises(ContractError):
        plan_candidate([i / 24 for i in range(119)], C, "x")
    # 24 fps clip whose last frame lands 0.01 s early (container rounding) passes
    assert len(plan_candidate([i * (4.948 / 119) for i in range(120)], C, "x").indices) == 5


def test_vfr_context_picks_nearest_times():
    times = [0.0, 0.2, 0.3, 0.5, 0.6, 0.8, 0.9, 1.1, 1.2, 1.4, 1.5, 1.7, 1.8, 2.0]
    plan = plan_context(times, C, "vfr")
    assert plan.times == (0.0, 0.9, 2.0)  # 1.0: 0.9 vs 1.1 tie -> earlier


def test_empty_or_backwards_times_are_input_errors():
    with pytest.raises(InputError, match="no video frames"):
        plan_context([], C, "x")
    with pytest.raises(InputError, match="backwards"):
        plan_context([0.0, 1.0, 0.5], C, "x")


def test_plan_runs_start_at_keyframes_and_merge_touching_gops():
    from nvrm.video.decode import plan_runs

    key = [i % 4 == 0 for i in range(16)]  # GOPs of 4 frames
    assert plan_runs(key, [0, 5, 9], 15) == [(0, 0), (4, 5), (8, 9), (12, 15)]
    assert plan_runs(key, [0, 3, 4], 4) == [(0, 4)]  # GOP 2 starts right after: no seek
    assert plan_runs([True] * 6, [0, 2, 4], 5) == [(0, 0), (2, 2), (4, 5)]
    assert plan_runs([True] + [False] * 9, [0, 9], 9) == [(0, 9)]
