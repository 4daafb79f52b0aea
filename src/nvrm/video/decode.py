"""Decode a video with PyAV and keep only the frames the 1 FPS plan needs.

Two strategies give the same frames:

* **Seek** (tried first). One demux pass reads every packet's presentation
  time and keyframe flag without decoding anything (a candidate's pass stops
  shortly after its window). That index is enough to
  plan the sampling, so only the groups of pictures (GOPs) that hold a
  sampled frame are decoded: the decoder seeks to each needed keyframe and
  stops at the last needed frame, and the final frame of the planned window
  is always decoded so a truncated tail is still caught. Every decoded
  frame's timestamp is checked against the index; any disagreement (a
  decoder that drops or merges frames, missing or duplicate timestamps,
  packets flagged corrupt or discarded) abandons the seek path.
  Intra-only and short-GOP files decode a handful of frames instead of all.
* **Sequential** (the fallback and the authority on errors). Frames are
  decoded in presentation order; a frame is converted to RGB
  (``frame.to_image()``, PyAV's default conversion) only if it neighbours a
  sampling tick. The candidate stops once it has seen a frame at or past the
  end of its window.

Seeking never changes which frames are chosen or their pixels (decoding from
a keyframe reproduces the same pictures); tests compare both strategies.
Corruption confined to a GOP that holds no sampled frame is not decoded and
so not reported by the seek path.
"""

from __future__ import annotations

import bisect
import functools
import io
import logging
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TYPE_CHECKING, Callable, Sequence, Union

import av
from PIL import Image

if TYPE_CHECKING:
    import numpy as np

from ..contract import Contract
from ..errors import InputError, LimitError
from ..limits import Limits
from .sampling import SamplePlan, clip_duration, plan_candidate, plan_context

VideoSource = Union[str, os.PathLike, bytes, bytearray, memoryview]
Transform = Callable[[Image.Image, float], Image.Image]
"""Applied to each sampled frame as soon as it is decoded (the per-frame contract), so a large
source never keeps more than one full-size frame alive."""

log = logging.getLogger("nvrm")
_DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class SampledFrames:
    """RGB frames chosen by the contract's sampling plan, in tick order."""

    plan: SamplePlan
    images: tuple[Image.Image, ...]
    source: str
    decoded: int = 0
    """How many frames were decoded to produce ``images``."""
    strategy: str = "sequential"
    """``"seek"`` or ``"sequential"``."""


def describe(source: VideoSource) -> str:
    """How an input is named in messages."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    return str(source)


REFERENCING_DEMUXERS = frozenset({
    "hls", "concat", "ffmetadata", "sdp", "rtp", "rtsp", "sap", "webm_dash_manifest", "lavfi",
    "alsa", "oss", "fbdev", "kmsgrab", "x11grab", "video4linux2", "v4l2",
})
"""Demuxers that open other files or URLs named inside the input (playlists, concat lists, session
descriptions) or read devices. FFmpeg never uses them here: a playlist inside ``--allow-dir`` could
otherwise read a segment outside it. Every other demuxer PyAV's FFmpeg has is allowed."""


def _demuxer_whitelist() -> str:
    names = {n for f in av.formats_available for n in f.split(",")}
    return ",".join(sorted(n for n in names if n not in REFERENCING_DEMUXERS))


@functools.cache
def open_options() -> dict[str, str]:
    """FFmpeg options of every open: whitelisted demuxers, and only the ``file`` protocol (for paths)."""
    return {"format_whitelist": _demuxer_whitelist(), "protocol_whitelist": "file"}


def _open(source: VideoSource, name: str) -> av.container.InputContainer:
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise InputError(name, "video bytes are empty")
        handle: object = io.BytesIO(bytes(source))
    else:
        path = Path(source)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise InputError(name, "file not found") from None
        except OSError as e:
            raise InputError(name, f"cannot read ({e.strerror})") from None
        if stat.S_ISDIR(st.st_mode):
            raise InputError(name, "is a directory, not a video file")
        if not stat.S_ISREG(st.st_mode):  # a FIFO, socket or device would block or never end
            raise InputError(name, "is not a regular file (a FIFO, socket or device); pass a video file")
        if st.st_size == 0:
            raise InputError(name, "file is empty (0 bytes)")
        handle = "file:" + str(path.absolute())  # a name with ':' (take:1.mp4) is not read as a protocol
    try:
        return av.open(handle, mode="r", container_options=open_options())
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


def _stream_rate(stream) -> float | None:
    rate = float(stream.average_rate) if stream.average_rate else None
    if not rate and stream.guessed_rate:
        rate = float(stream.guessed_rate)
    return rate


def _plan_for(role: str, times, contract: Contract, name: str, nominal: float | None, limits: Limits) -> SamplePlan:
    if role == "candidate":
        return plan_candidate(times, contract, name, nominal)
    limits.check_context_duration(clip_duration(times, nominal), name)
    plan = plan_context(times, contract, name, nominal)
    limits.check_context_frames(len(plan.indices), name)
    return plan


@dataclass(frozen=True)
class Header:
    """What the container says before anything is decoded."""

    width: int
    height: int
    rate: float | None
    duration: float | None
    """Declared duration (s) of the video stream, or of the container; None when unknown."""


# A context whose decodable duration falls short of the declared one by more than this
# (and more than _SHORTFALL_S) is truncated: refused rather than scored as a shorter clip.
_SHORTFALL_FRACTION = 0.05
_SHORTFALL_S = 0.5


def declared_bound(declared: float) -> float:
    """Latest frame time (s) a context whose header declares ``declared`` seconds may have: a frame past
    it means the header understates the video, and decoding stops there (the service reserves memory
    by this bound, ``nvrm.serve.admission.budget``)."""
    return declared + max(_SHORTFALL_S, _SHORTFALL_FRACTION * declared)


def _check_not_longer(header: Header, t: float, role: str, name: str) -> None:
    """A context holding frames past what its header declares (by more than a little) is refused."""
    if role == "context" and header.duration is not None and t > declared_bound(header.duration):
        raise InputError(
            name,
            f"holds more video than its container declares: a frame at {t:.2f} s, the header says {header.duration:.2f} s "
            "(remux the file so its header states its duration)",
        )


def _header(container, stream) -> Header:
    ctx = stream.codec_context
    duration = None
    if stream.duration is not None and stream.time_base is not None:
        duration = float(stream.duration * stream.time_base)
    elif container.duration:
        duration = container.duration / 1_000_000
    return Header(int(ctx.width or 0), int(ctx.height or 0), _stream_rate(stream), duration)


def _preflight(header: Header, role: str, name: str, limits: Limits) -> None:
    """The limits that can be checked from the header alone, before decoding."""
    if header.width and header.height:
        limits.check_source(header.width, header.height, name)
    if header.rate:
        limits.check_fps(header.rate, name)
    if role == "context" and header.duration is not None:
        limits.check_context_duration(header.duration, name)


def _check_complete(header: Header, times: Sequence[float], nominal: float | None, role: str, name: str) -> None:
    """A context shorter than its header declares, by more than a little, is truncated; one longer is refused."""
    if role != "context" or header.duration is None or not times:
        return
    _check_not_longer(header, times[-1], role, name)
    got = clip_duration(times, nominal)
    short = header.duration - got
    if short > max(_SHORTFALL_S, _SHORTFALL_FRACTION * header.duration):
        raise InputError(
            name,
            f"is truncated: the container declares {header.duration:.2f} s but only {got:.2f} s can be decoded "
            "(re-encode or remux the file)",
        )


def read_sampled(
    source: VideoSource,
    role: str,
    contract: Contract,
    *,
    strategy: str = "auto",
    limits: Limits | None = None,
    transform: Transform | None = None,
) -> SampledFrames:
    """Decode ``source`` and return the frames the contract samples for ``role``.

    ``role`` is ``"candidate"`` (first window, 1 FPS ticks 0..N-1) or
    ``"context"`` (every tick below the clip's duration). ``strategy`` is
    ``"auto"`` (the index-driven seek path when the file allows it, else
    sequential) or ``"sequential"``. The ``limits`` that the header can
    answer (source size, frame rate, declared context duration) are checked
    before anything is decoded; ``transform`` (the per-frame contract) runs on
    each sampled frame as soon as it is decoded.
    """
    if strategy not in ("auto", "sequential"):
        raise ValueError(f"strategy must be 'auto' or 'sequential', got {strategy!r}")
    limits = limits or _DEFAULT_LIMITS
    if strategy != "sequential":
        try:
            found = _read_seeking(source, role, contract, limits, transform)
        except LimitError:
            raise  # refused before the work: the sequential path would do that work first
        except Exception as e:  # noqa: BLE001 - the sequential path is the authority on errors
            _log_fallback(type(e).__name__, str(e))
            found = None
        if found is not None:
            return found
    return _read_sequential(source, role, contract, limits, transform)


_FALLBACKS: set[str] = set()


def _log_fallback(kind: str, message: str) -> None:
    """Seeking failed: say why, once per kind of failure per process (then decode sequentially)."""
    if kind not in _FALLBACKS:
        _FALLBACKS.add(kind)
        log.info("seek-based decoding failed (%s: %s); decoding sequentially (logged once per kind)", kind, " ".join(message.split())[:200])


class _Mismatch(Exception):
    """The decoder disagreed with the demux index; use the sequential path."""


@dataclass(frozen=True)
class _Index:
    pts: tuple[int, ...]
    """Presentation timestamps (stream time base), sorted."""
    keyframe: tuple[bool, ...]
    """Whether the packet presented at ``pts[i]`` is a keyframe."""


# Packets read past the end of a candidate window before the index stops:
# enough to cover any decoder reordering (B-frames) around the boundary.
_REORDER_SLACK = 32


def _demux_index(container, stream, window: float | None = None) -> _Index | None:
    """Every packet's pts and keyframe flag (only up to about ``window`` s if given)."""
    entries: list[tuple[int, bool]] = []
    tb = stream.time_base
    first: int | None = None
    past = 0
    for packet in container.demux(stream):
        if packet.size == 0 and packet.pts is None:
            continue  # the demuxer's end-of-stream marker
        if packet.pts is None or packet.is_corrupt or packet.is_discard:
            return None
        pts = int(packet.pts)
        entries.append((pts, bool(packet.is_keyframe)))
        first = pts if first is None else min(first, pts)
        if window is not None and (past or float((pts - first) * tb) >= window):
            past += 1
            if past > _REORDER_SLACK:
                break
    entries.sort()
    if not entries or any(a[0] == b[0] for a, b in zip(entries, entries[1:])) or not entries[0][1]:
        return None
    return _Index(tuple(p for p, _ in entries), tuple(k for _, k in entries))


def plan_runs(keyframe: Sequence[bool], needed: Sequence[int], last: int) -> list[tuple[int, int]]:
    """Decode runs ``(start, stop)`` (inclusive frame positions) covering ``needed`` and ``last``.

    Each run starts at the keyframe at or before its first needed frame; runs
    whose GOPs touch or overlap are merged so the decoder never seeks backwards.
    Pure: ``keyframe[i]`` says whether presentation position ``i`` is a keyframe.
    """
    starts = [i for i, k in enumerate(keyframe) if k]
    runs: list[tuple[int, int]] = []
    for n in sorted(set(needed) | {last}):
        start = starts[bisect.bisect_right(starts, n) - 1]
        if runs and start <= runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], max(runs[-1][1], n))
        else:
            runs.append((start, n))
    return runs


def _read_seeking(source: VideoSource, role: str, contract: Contract, limits: Limits, transform: Transform | None) -> SampledFrames | None:
    name = describe(source)
    with _open(source, name) as container:
        streams = container.streams.video
        if not streams:
            return None
        stream = streams[0]
        header = _header(container, stream)
        _preflight(header, role, name, limits)
        rate = _stream_rate(stream)
        nominal = 1.0 / rate if rate else None
        tb = stream.time_base
        window = contract.candidate_seconds if role == "candidate" else None
        index = _demux_index(container, stream, window)
        if index is None or tb is None:
            return None
        times = [float((p - index.pts[0]) * tb) for p in index.pts]
        if role == "candidate":
            end = next((i for i, t in enumerate(times) if t >= contract.candidate_seconds), len(times) - 1)
            times = times[: end + 1]
        last = len(times) - 1
        _check_complete(header, times, nominal, role, name)
        plan = _plan_for(role, times, contract, name, nominal, limits)
        runs = plan_runs(index.keyframe[: last + 1], plan.indices, last)
    with _open(source, name) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        wanted = set(plan.indices)
        kept: dict[int, Image.Image] = {}
        decoded = 0
        for start, stop in runs:
            if start > 0:
                container.seek(index.pts[start], stream=stream, backward=True, any_frame=False)
            pos = start
            for frame in container.decode(stream):
                if frame.pts is None:
                    raise _Mismatch
                if frame.pts < index.pts[start]:
                    continue  # landed on an earlier keyframe
                decoded += 1
                if frame.pts != index.pts[pos]:
                    raise _Mismatch
                if pos in wanted:
                    image = _image(frame, name)
                    kept[pos] = transform(image, times[pos]) if transform else image
                if pos == stop:
                    break
                pos += 1
            else:
                raise _Mismatch  # the stream ended before the index said it would
    return SampledFrames(plan, tuple(kept[i] for i in plan.indices), name, decoded, "seek")


_ROTATED: set[str] = set()


def _note_rotation(frame: av.VideoFrame, name: str) -> None:
    """The contract scores frames as stored: display rotation (a phone video's rotation=90) is not
    applied, as the release's decoders do not apply it. Said once per input, never silently."""
    rotation = getattr(frame, "rotation", 0) or 0
    if rotation and name not in _ROTATED:
        if len(_ROTATED) < 4096:
            _ROTATED.add(name)
        log.warning(
            "%s: display rotation %d° is not applied; the contract scores frames as stored (rotate the pixels "
            "first if the model should see them upright)", name, rotation,
        )


def _image(frame: av.VideoFrame, name: str) -> Image.Image:
    _note_rotation(frame, name)
    return frame.to_image()


def _checked_stream(container: "av.container.InputContainer", role: str, name: str, limits: Limits):
    """The first video stream, set up for threaded decoding, and its header, once the header limits pass."""
    streams = container.streams.video
    if not streams:
        raise InputError(name, "has no video stream (audio-only or not a video file)")
    stream = streams[0]
    header = _header(container, stream)
    _preflight(header, role, name, limits)
    stream.thread_type = "AUTO"
    return stream, header


def _read_sequential(source: VideoSource, role: str, contract: Contract, limits: Limits, transform: Transform | None) -> SampledFrames:
    name = describe(source)

    def keep(frame: av.VideoFrame, t: float) -> Image.Image:
        image = _image(frame, name)
        return transform(image, t) if transform else image

    with _open(source, name) as container:
        stream, header = _checked_stream(container, role, name, limits)
        rate = _stream_rate(stream)
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
                if role == "context" and t > limits.max_context_seconds:
                    limits.check_context_duration(t, name)
                _check_not_longer(header, t, role, name)  # stop at once: what was reserved covers no more
                if not times:
                    kept[0] = keep(frame, t)
                else:
                    # Ticks in (previous time, t]: both neighbours may be the nearest frame.
                    lo = math.floor(times[-1] * fps + 1e-9) + 1
                    hi = math.floor(t * fps + 1e-9)
                    if hi >= lo:
                        if len(times) - 1 not in kept and prev is not None:
                            kept[len(times) - 1] = keep(prev, times[-1])
                        kept[i] = keep(frame, t)
                times.append(t)
                prev = frame
                if t >= stop_at:
                    break
        except InputError:
            raise
        except MemoryError as e:
            raise InputError(
                name, f"ran out of memory decoding {header.width}x{header.height} frames after {len(times)} frame(s)"
            ) from e
        except (av.FFmpegError, EOFError, OSError) as e:
            raise InputError(
                name, f"decoding failed after {len(times)} frame(s) (truncated or corrupt?): {_ffmpeg_reason(e)}"
            ) from e
        if not times:
            raise InputError(name, "contains no decodable video frames")
        last = len(times) - 1
        if last not in kept and prev is not None:
            kept[last] = keep(prev, times[last])

    _check_complete(header, times, nominal, role, name)
    plan = _plan_for(role, times, contract, name, nominal, limits)
    return SampledFrames(plan, tuple(kept[i] for i in plan.indices), name, len(times), "sequential")


SAMPLED_SUFFIX = ".npy"
"""Files of frames already sampled at the contract's rate (the rollout record's ``.npy``): read as the sampled video they are."""
SAMPLED_RATE = 1.0
"""The frame rate of a ``.npy`` of sampled frames: the release contract's sample rate (1 FPS)."""


def is_sampled_file(source: Any) -> bool:
    """Whether ``source`` names a ``.npy`` file of sampled frames (a path, not bytes)."""
    return isinstance(source, (str, os.PathLike)) and os.fspath(source).lower().endswith(SAMPLED_SUFFIX)


def read_sampled_file(source: "str | os.PathLike", limits: Limits | None = None) -> "np.ndarray":
    """uint8 ``(T, H, W, 3)`` frames of a ``.npy`` file (never a pickle), checked: shape, dtype, frame count and size."""
    import numpy as np

    limits = limits or _DEFAULT_LIMITS
    name = os.fspath(source)
    try:
        frames = np.load(name, allow_pickle=False, mmap_mode="r")
    except FileNotFoundError as e:
        raise InputError(name, "no such file") from e
    except (OSError, ValueError, EOFError) as e:
        raise InputError(name, f"not a .npy array of frames ({' '.join(str(e).split())[:160]})") from e
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
        raise InputError(name, f"a .npy of sampled frames must hold uint8 (T, H, W, 3), T >= 1; it holds {frames.dtype} {tuple(frames.shape)}")
    limits.check_source(int(frames.shape[2]), int(frames.shape[1]), name)
    limits.check_context_frames(int(frames.shape[0]), name)
    return np.ascontiguousarray(frames)


def decode_frames(source: VideoSource, *, max_seconds: float | None = None, limits: Limits | None = None) -> tuple["np.ndarray", float]:
    """Every frame (RGB uint8, ``(T, H, W, 3)``) up to ``max_seconds``, and the stream's average frame rate.

    For tools that change the frames themselves before the contract (``nvrm probe``, the judges);
    scoring never uses it. The header limits are checked first, as for scoring. A ``.npy`` of sampled
    frames is those frames at ``SAMPLED_RATE``.
    """
    import numpy as np

    limits = limits or _DEFAULT_LIMITS
    if is_sampled_file(source):
        frames = read_sampled_file(source, limits)  # type: ignore[arg-type]
        if max_seconds is not None:
            frames = frames[: max(1, int(round(max_seconds * SAMPLED_RATE)))]
        return frames, SAMPLED_RATE
    name = describe(source)
    with _open(source, name) as container:
        stream, header = _checked_stream(container, "candidate" if max_seconds is not None else "context", name, limits)
        frames, first = [], None
        try:
            for i, frame in enumerate(container.decode(stream)):
                t = _frame_time(frame, i, header.rate)
                first = t if first is None else first
                if max_seconds is not None and t is not None and t - first >= max_seconds:
                    break
                _note_rotation(frame, name)
                frames.append(frame.to_ndarray(format="rgb24"))
        except (av.FFmpegError, EOFError, OSError) as e:
            raise InputError(name, f"decoding failed after {len(frames)} frame(s) (truncated or corrupt?): {_ffmpeg_reason(e)}") from e
    if not frames:
        raise InputError(name, "contains no decodable video frames")
    return np.stack(frames), float(header.rate or 1.0)


def declared_duration(source: VideoSource) -> float | None:
    """The duration (s) the container declares for its video stream, read from the header only; None
    when it declares none or cannot be opened (the decode that follows reports why)."""
    name = describe(source)
    try:
        with _open(source, name) as container:
            streams = container.streams.video
            return _header(container, streams[0]).duration if streams else None
    except (InputError, av.FFmpegError, OSError, ValueError):
        return None
