"""Generate test clips with PyAV's bundled encoders (no system ffmpeg needed).

``moving_square`` makes frames whose content depends on time, so tests can
tell which source frame was sampled; ``write_video`` encodes them in a chosen
codec / pixel format, optionally with variable frame timing.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Sequence

import av
import numpy as np


def moving_square(
    n: int,
    height: int = 96,
    width: int = 128,
    *,
    seed: int = 0,
    speed: float = 3.0,
    size: int | None = None,
) -> np.ndarray:
    """uint8 (n, H, W, 3): a bright square moving over a seeded textured background.

    Frame i also carries its index in the top-left 8x8 block's red channel
    (i mod 256), so a decoded frame can be matched to its source index.
    """
    rng = np.random.default_rng(seed)
    bg = rng.integers(30, 200, size=(height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    bg = np.kron(bg, np.ones((8, 8, 1), dtype=np.uint8))[:height, :width]
    color = rng.integers(0, 256, size=3, dtype=np.uint8)
    side = size or max(4, min(height, width) // 4)
    frames = np.empty((n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        f = bg.copy()
        x = int(i * speed) % max(1, width - side)
        y = int(i * speed / 2) % max(1, height - side)
        f[y : y + side, x : x + side] = color
        f[:8, :8] = (i % 256, 0, 0)
        frames[i] = f
    return frames


def write_video(
    path: str | Path,
    frames: np.ndarray,
    fps: float = 8.0,
    *,
    codec: str = "libx264",
    pix_fmt: str = "yuv420p",
    times: Sequence[float] | None = None,
    options: dict | None = None,
) -> Path:
    """Encode RGB uint8 frames to ``path`` (container from the extension).

    ``times`` (seconds, increasing) gives each frame its own timestamp for
    variable-frame-rate clips; otherwise frame i is at i / fps.
    """
    path = Path(path)
    rate = Fraction(fps).limit_denominator(1000)
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width = frames.shape[2]
        stream.height = frames.shape[1]
        stream.pix_fmt = pix_fmt
        if codec in ("libx264", "libx265"):
            stream.options = {"preset": "ultrafast", "bframes": "0", **(options or {})}
        elif options:
            stream.options = options
        if times is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
        for i, arr in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            if times is not None:
                frame.pts = int(round(times[i] * 1000))
                frame.time_base = Fraction(1, 1000)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def write_audio_only(path: str | Path, seconds: float = 1.0, rate: int = 16000) -> Path:
    """A file with one audio stream and no video."""
    path = Path(path)
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream("pcm_s16le", rate=rate)
        stream.layout = "mono"
        n = int(seconds * rate)
        samples = (np.sin(np.arange(n) / 10.0) * 8000).astype(np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.rate = rate
        frame.pts = 0
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path
