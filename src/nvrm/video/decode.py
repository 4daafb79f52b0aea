"""Decode a video with PyAV and keep only the frames the 1 FPS plan needs.

Frames are decoded in presentation order. A frame is converted to RGB
(``frame.to_image()``, PyAV's default conversion) only if it is one of the
two neighbours of some sampling tick, so a 60 fps 4K clip never holds more
than a handful of RGB images. The candidate stops decoding once it has seen a
frame at or past the end of its window.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import av
from PIL import Image

from ..contract import Contract
from ..errors import InputError
from .sampling import SamplePlan, plan_candidate, plan_context

VideoSource = Union[str, os.PathLike, bytes, bytearray, memoryview]


@dataclass(frozen=True)
class SampledFrames:
    """RGB frames chosen by the contract's sampling plan, in tick order."""

    plan: SamplePlan
    images: tuple[Image.Image, ...]
    source: str


def describe(source: VideoSource) -> str:
    """How an input is named in messages."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    return str(source)


def _open(source: VideoSource, name: str) -> av.container.InputContainer:
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise InputError(name, "video bytes are empty")
        handle: object = io.BytesIO(bytes(source))
    else:
        path = Path(source)
        if not path.exists():
            raise InputError(name, "file not found")
        if path.is_dir():
            raise InputError(name, "is a directory, not a video file")
        if path.stat().st_size == 0:
            raise InputError(name, "file is empty (0 bytes)")
        handle = str(path)
    try:
        return av.open(handle, mode="r")
    except av.FFmpegError as e:
        raise InputError(name, f"not a readable video ({_ffmpeg_reason(e)})") from e
    except (OSError, ValueError) as e:
        raise InputError(name, f"cannot open ({e})") from e


def _ffmpeg_reason(e: Exception) -> str:
    msg = getattr(e, "strerror", None) or str(e)
    return " ".join(str(msg).split())


def _frame_time(frame: av.VideoFrame, index: int, rate: float | None) -> float | None:
    if frame.pts is not None and frame.time_base is not None:
        return float(frame.pts * frame.time_base)
    if frame.time is not None:
        return float(frame.time)
    if rate:
        return index / rate
    return None


def read_sampled(source: VideoSource, role: str, contract: Contract) -> SampledFrames:
    """Decode ``source`` and return the frames the contract samples for ``role``.

    ``role`` is ``"candidate"`` (first window, 1 FPS ticks 0..N-1) or
    ``"context"`` (every tick below the clip's duration).
    """
    name = describe(source)
    with _open(source, name) as container:
        streams = container.streams.video
        if not streams:
            raise InputError(name, "has no video stream (audio-only or not a video file)")
        stream = streams[0]
        stream.thread_type = "AUTO"
        rate = float(stream.average_rate) if stream.average_rate else None
        if not rate and stream.guessed_rate:
            rate = float(stream.guessed_rate)
        nominal = 1.0 / rate if rate else None
        stop_at = contract.candidate_seconds if role == "candidate" else math.inf

        times: list[float] = []
        kept: dict[int, Image.Image] = {}
        prev: av.VideoFrame | None = None
        first: float | None = None
        fps = contract.sample_fps
        try:
            for i, frame in enumerate(container.decode(stream)):
                t_abs = _frame_time(frame, i, rate)
                if t_abs is None:
                    raise InputError(name, "frames carry no timestamps and the stream has no frame rate")
                if first is None:
                    first = t_abs
                t = t_abs - first
                if times and t < times[-1]:
                    raise InputError(name, "frame timestamps go backwards; remux the file with monotonic timestamps")
                if not times:
                    kept[0] = frame.to_image()
                else:
                    # Ticks in (previous time, t]: both neighbours may be the nearest frame.
                    lo = math.floor(times[-1] * fps + 1e-9) + 1
                    hi = math.floor(t * fps + 1e-9)
                    if hi >= lo:
                        if len(times) - 1 not in kept and prev is not None:
                            kept[len(times) - 1] = prev.to_image()
                        kept[i] = frame.to_image()
                times.append(t)
                prev = frame
                if t >= stop_at:
                    break
        except InputError:
            raise
        except (av.FFmpegError, EOFError, OSError) as e:
            raise InputError(
                name, f"decoding failed after {len(times)} frame(s) (truncated or corrupt?): {_ffmpeg_reason(e)}"
            ) from e
        if not times:
            raise InputError(name, "contains no decodable video frames")
        last = len(times) - 1
        if last not in kept and prev is not None:
            kept[last] = prev.to_image()

    if role == "candidate":
        plan = plan_candidate(times, contract, name, nominal)
    else:
        plan = plan_context(times, contract, name, nominal)
    return SampledFrames(plan, tuple(kept[i] for i in plan.indices), name)
