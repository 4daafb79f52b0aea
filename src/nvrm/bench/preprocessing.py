"""``nvrm bench --workload engine``: the preprocessing engine's frames/s by worker count and kind.

The same inputs (in-memory clips at the RL resolution, so decoding is not
what is measured) go through ``Engine.submit_video`` with thread and with
process workers, at each worker count, side by side in one run. Every
configuration's output is checked against the inline (no worker) output,
bit for bit. It also measures how much of its time each per-frame stage
holds the GIL (a Python thread spinning next to it loses that share of its
speed), which bounds how far threads can scale: about 1 / share.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import numpy as np
import torch

from ..engine import Engine
from ..engine.tasks import encode_video
from ..video.inputs import prepare_input
from .harness import build_bench_bundle, device_name
from .rl import CANDIDATE_SECONDS, make_frames


def _same(a, b) -> bool:
    return (
        a.times == b.times
        and torch.equal(a.pixels, b.pixels)
        and torch.equal(a.grid, b.grid)
        and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a.images, b.images))
    )


def gil_share(job, seconds: float = 1.5) -> float:
    """Share of its running time ``job`` holds the GIL (spinner slowdown next to it, 0..1)."""

    def spin(t: float) -> int:
        n, end = 0, time.perf_counter() + t
        while time.perf_counter() < end:
            n += 1
        return n

    solo = spin(seconds)
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            job()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    shared = spin(seconds)
    stop.set()
    th.join()
    return max(0.0, 1.0 - shared / solo)


def run_engine(
    arch: str = "tiny",
    configs: tuple[tuple[str, int], ...] = (("thread", 1), ("thread", 2), ("process", 1), ("process", 2)),
    candidates: int = 16,
    fps: float = 8.0,
    size: tuple[int, int] = (480, 832),
    repeats: int = 3,
) -> dict[str, Any]:
    """frames/s of each (kind, workers) configuration on the same candidates, and bit-identity."""
    from ..video.inputs import Clip

    bundle = build_bench_bundle(arch)
    h, w = size
    clips = [Clip(make_frames(int(CANDIDATE_SECONDS * fps), h, w, seed=i), fps, name=f"candidate {i}") for i in range(candidates)]
    with Engine.for_bundle(bundle, workers=0) as inline:
        reference = [inline.prepare(c, "candidate") for c in clips]
        state = inline._workers.local_state()
        frames = sum(len(r.images) for r in reference)
        sample, contract = clips[0], inline.contract
        bare = dataclasses.replace(reference[0], pixels=None, grid=None)
        shares = {
            "contract": gil_share(lambda: prepare_input(sample, "candidate", contract)),
            "encode": gil_share(lambda: encode_video(state, bare)),
        }
    rows = []
    base: dict[str, float] = {}
    for kind, n in configs:
        with Engine.for_bundle(bundle, workers=n, kind=kind) as engine:
            warm = [engine.submit_video(c, "candidate") for c in clips[: max(2, n)]]
            [f.result() for f in warm]  # worker start-up is not measured
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                out = [f.result() for f in [engine.submit_video(c, "candidate") for c in clips]]
                best = min(best, time.perf_counter() - t)
            identical = all(_same(a, b) for a, b in zip(out, reference))
        fps_ = frames / best
        base.setdefault(kind, fps_ if n == 1 else float("nan"))
        rows.append({"kind": kind, "workers": n, "frames_per_s": fps_, "vs_1_worker": fps_ / base[kind], "bit_identical": identical})
    return {
        "workload": "engine",
        "arch": arch,
        "device_name": device_name(torch.device("cpu")),
        "frames": frames,
        "source": {"height": h, "width": w, "fps": fps, "clips": candidates},
        "gil_share": shares,
        "rows": rows,
    }


def format_engine(report: dict[str, Any]) -> str:
    s = report["source"]
    g = report["gil_share"]
    lines = [
        f"engine workload: {report['frames']} frames from {s['clips']} in-memory {s['width']}x{s['height']} clips; {report['device_name']}",
        f"GIL held: contract {100 * g['contract']:.0f}% of its time, encoding {100 * g['encode']:.0f}% "
        f"(threads scale to at most ~{1 / max(g['contract'], 1e-3):.0f}x and ~{1 / max(g['encode'], 1e-3):.0f}x)",
        "| kind | workers | frames/s | vs 1 worker | bit-identical |",
        "|---|---:|---:|---:|---|",
    ]
    for r in report["rows"]:
        lines.append(f"| {r['kind']} | {r['workers']} | {r['frames_per_s']:.1f} | {r['vs_1_worker']:.2f}x | {r['bit_identical']} |")
    return "\n".join(lines)
