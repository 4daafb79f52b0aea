"""Seek vs sequential decoding on the same clips, side by side in one run.

    .venv/bin/python benchmarks/seek_decode.py

For each encoding (24 fps, 12 s, 320x240) it times ``read_sampled`` with the
sequential strategy and with the default ("auto": seek when the demux index
allows it and it saves work) for the context and candidate roles, checks the
frames are bit-identical and prints decoded-frame counts and the time ratio.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from nvrm.contract import RELEASE_CONTRACT
from nvrm.synth.clips import moving_square, write_video
from nvrm.video.decode import read_sampled

ENCODINGS = {
    "h264 default GOP (250)": (dict(), ".mp4"),
    "h264 GOP 24, B-frames": (dict(options={"g": "24", "bframes": "3", "preset": "medium"}), ".mp4"),
    "vp9 GOP 24": (dict(codec="libvpx-vp9", options={"g": "24"}), ".webm"),
    "mjpeg (intra only)": (dict(codec="mjpeg", pix_fmt="yuvj420p"), ".mkv"),
    "ffv1 (lossless)": (dict(codec="ffv1"), ".mkv"),
}


def best_of(fn, n: int = 5) -> tuple[object, float]:
    best = float("inf")
    out = None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def main() -> None:
    frames = moving_square(24 * 12, 240, 320)
    with tempfile.TemporaryDirectory() as tmp:
        print("| encoding | role | frames decoded (sequential -> auto) | strategy | time ratio seq/auto | identical |")
        print("|---|---|---:|---|---:|---|")
        for name, (kw, suffix) in ENCODINGS.items():
            path = write_video(Path(tmp) / f"clip{suffix}", frames, 24, **kw)
            for role in ("context", "candidate"):
                seq, t_seq = best_of(lambda: read_sampled(path, role, RELEASE_CONTRACT, strategy="sequential"))
                auto, t_auto = best_of(lambda: read_sampled(path, role, RELEASE_CONTRACT))
                same = seq.plan == auto.plan and all(
                    np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(seq.images, auto.images)
                )
                print(
                    f"| {name} | {role} | {seq.decoded} -> {auto.decoded} | {auto.strategy} | "
                    f"{t_seq / t_auto:.2f}x | {same} |"
                )
            path.unlink()


if __name__ == "__main__":
    main()
