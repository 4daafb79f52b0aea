"""Which source frames the contract keeps: pure functions of frame times.

Times are presentation times in seconds relative to the first decoded frame.
A clip's duration is its last frame time plus one frame interval; the interval
is the mean spacing of the frames (exactly 1/fps for constant frame rate), or
the stream's nominal interval when there is a single frame.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Sequence

from ..contract import Contract
from ..errors import ContractError, InputError

# Tolerance when comparing a time to a sampling tick: PTS rounding in
# containers (e.g. 1/90000 s units) must not move a tick to the next frame.
_EPS = 1e-9


@dataclass(frozen=True)
class SamplePlan:
    """The frames one input contributes: source indices and their times."""

    indices: tuple[int, ...]
    """Index into the source's frames (presentation order), one per sampled tick."""
    times: tuple[float, ...]
    """Presentation time (s) of each chosen frame."""
    ticks: tuple[float, ...]
    """The sampling tick (s) each frame was chosen for."""
    duration: float
    """Duration of the source (s): last frame time + one frame interval."""


def frame_interval(times: Sequence[float], nominal: float | None = None) -> float:
    """Mean spacing of ``times``; ``nominal`` (or 0) when there is only one frame."""
    if len(times) >= 2:
        return (times[-1] - times[0]) / (len(times) - 1)
    return float(nominal) if nominal and nominal > 0 else 0.0


def clip_duration(times: Sequence[float], nominal_interval: float | None = None) -> float:
    if not times:
        return 0.0
    return times[-1] + frame_interval(times, nominal_interval)


def nearest_index(times: Sequence[float], tick: float) -> int:
    """Index of the frame nearest to ``tick``; a tie goes to the earlier frame.

    ``times`` must be sorted ascending.
    """
    j = bisect.bisect_left(times, tick)
    if j == 0:
        return 0
    if j == len(times):
        return len(times) - 1
    before, after = times[j - 1], times[j]
    return j - 1 if (tick - before) <= (after - tick) + _EPS else j


def candidate_ticks(contract: Contract) -> tuple[float, ...]:
    """t = 0, 1/fps, ... for the candidate window (0..4 s for the release)."""
    return tuple(k / contract.sample_fps for k in range(contract.candidate_frames))


# No context can need more ticks than this (a day at 1 FPS): the callers' limits are far lower,
# this only keeps the loop below finite on a nonsensical duration.
_MAX_TICKS = 86_400


def context_ticks(duration: float, contract: Contract) -> tuple[float, ...]:
    """Every tick t = k/fps strictly below ``duration``; capped to the most recent."""
    if not math.isfinite(duration) or duration * contract.sample_fps > _MAX_TICKS:
        raise ContractError("context", f"duration {duration:.6g} s is not a usable context length")
    ticks: list[float] = []
    k = 0
    while k / contract.sample_fps < duration - _EPS or k == 0:
        ticks.append(k / contract.sample_fps)
        k += 1
    if contract.max_context_frames is not None:
        ticks = ticks[-contract.max_context_frames :]
    return tuple(ticks)


def check_candidate_duration(duration: float, interval: float, contract: Contract, source: str) -> None:
    """A candidate may fall short of the window by at most half a source-frame interval."""
    if duration + interval / 2 + _EPS < contract.candidate_seconds:
        hint = ""
        if interval > 0:
            need = math.ceil(contract.candidate_seconds / interval - 0.5 - 1e-9)
            hint = f" ({need} frames at {1 / interval:.4g} fps)"
        raise ContractError(
            source,
            f"candidate is {duration:.2f} s; the contract needs {contract.candidate_seconds:.2f} s of video{hint}; "
            "generate a longer clip, or opt in to scoring what exists with Contract(short_candidates=True) (off-contract)",
        )


def _plan(times: Sequence[float], ticks: Sequence[float], duration: float) -> SamplePlan:
    indices = tuple(nearest_index(times, t) for t in ticks)
    return SamplePlan(indices, tuple(times[i] for i in indices), tuple(ticks), duration)


def _check_times(times: Sequence[float], source: str) -> None:
    if not times:
        raise InputError(source, "contains no video frames")
    if any(b < a for a, b in zip(times, times[1:])):
        raise InputError(source, "frame timestamps go backwards; remux the file with monotonic timestamps")


def plan_candidate(
    times: Sequence[float], contract: Contract, source: str, nominal_interval: float | None = None
) -> SamplePlan:
    """Frames nearest to t = 0, 1, ..., 4 s; refuses a candidate shorter than the window."""
    _check_times(times, source)
    interval = frame_interval(times, nominal_interval)
    duration = times[-1] + interval
    if contract.short_candidates and duration + interval / 2 + _EPS < contract.candidate_seconds:
        ticks = tuple(t for t in candidate_ticks(contract) if t < duration - _EPS) or (0.0,)
        return _plan(times, ticks, duration)
    check_candidate_duration(duration, interval, contract, source)
    return _plan(times, candidate_ticks(contract), duration)


def plan_context(
    times: Sequence[float], contract: Contract, source: str, nominal_interval: float | None = None
) -> SamplePlan:
    """Frames nearest to every tick below the context's duration (most recent kept if capped)."""
    _check_times(times, source)
    duration = clip_duration(times, nominal_interval)
    return _plan(times, context_ticks(duration, contract), duration)
