"""``nvrm bench --workload files``: the naive path vs score_batch vs score_group, side by side.

For each context length and group size G, the same prompt, context file and G
candidate files go through:

- naive: per candidate, the plain reference pipeline (decode every frame,
  Pillow + fetch_image, AutoProcessor) and a full forward of transformers'
  own model; no reuse, no pool;
- batch: ``RewardModel.score_batch`` (pool, token-budget batches);
- group: ``RewardModel.score_group`` (context once, prefix KV reuse).

Numbers are only comparable within one run (shared, noisy machines): report
ratios. Preprocessing is measured separately in frames/s, and checked to be
bit-identical to the reference.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .harness import PeakMemory, build_bench_bundle, device_name, timed


@dataclass
class Row:
    context_s: int
    group: int
    path: str
    seconds_per_group: float
    candidates_per_s: float
    tokens_per_s: float
    peak_mem_mb: float
    speedup_vs_naive: float
    max_abs_diff_vs_naive: float


def make_clips(folder: Path, context_s: int, groups: int, fps: int, size: tuple[int, int]):
    from ..synth.clips import moving_square, write_video

    folder.mkdir(parents=True, exist_ok=True)
    h, w = size
    ctx = write_video(folder / f"ctx{context_s}.mp4", moving_square(context_s * fps, h, w, seed=context_s), fps)
    cands = [
        write_video(folder / f"cand{i}.mp4", moving_square(6 * fps, h, w, seed=100 + i, speed=1 + i % 5), fps)
        for i in range(groups)
    ]
    return ctx, cands


def bench_preprocessing(model, files: list[Path]) -> dict:
    """frames/s of the reference pipeline vs the runtime's pooled pipeline, and bit-identity."""
    from ..fidelity.reference import reference_images

    roles = ["context"] + ["candidate"] * (len(files) - 1)
    ref, t_ref = timed(lambda: [reference_images(f, r, model.contract) for f, r in zip(files, roles)], torch.device("cpu"))
    ours, t_ours = timed(
        lambda: [f.result() for f in [model.engine.submit_video(f, r) for f, r in zip(files, roles)]],
        torch.device("cpu"),
    )
    n = sum(len(imgs) for imgs, _ in ref)
    identical = all(
        np.array_equal(np.asarray(a), np.asarray(b)) for (imgs, _), p in zip(ref, ours) for a, b in zip(imgs, p.images)
    )
    return {
        "frames": n,
        "naive_frames_per_s": n / t_ref,
        "pooled_frames_per_s": n / t_ours,
        "speedup": t_ref / t_ours,
        "bit_identical": identical,
        "workers": model.engine.workers,
    }


def run_bench(
    arch: str = "mid",
    groups: tuple[int, ...] = (1, 4, 8, 16),
    contexts: tuple[int, ...] = (5, 10, 20),
    device: str | None = None,
    fps: int = 24,
    size: tuple[int, int] = (240, 320),
    naive: bool = True,
) -> dict:
    from ..scoring.reward_model import RewardModel
    from ..fidelity.reference import ReferenceScorer

    bundle = build_bench_bundle(arch)
    model = RewardModel.from_pretrained(bundle, device=device)
    dev = model.device
    reference = ReferenceScorer(bundle, device=str(dev)) if naive else None
    prompt = "A red square glides across a tiled floor while the camera holds still."
    rows: list[Row] = []
    prep = None
    with tempfile.TemporaryDirectory(prefix="nvrm-bench-") as tmp:
        for ctx_s in contexts:
            ctx, all_cands = make_clips(Path(tmp) / f"c{ctx_s}", ctx_s, max(groups), fps, size)
            if prep is None:
                prep = bench_preprocessing(model, [ctx] + all_cands)
            model.score_group(prompt, ctx, all_cands[:1])  # warm-up (allocator, kernels)
            for g in groups:
                cands = all_cands[:g]
                results = {}
                if reference is not None:
                    with PeakMemory(dev) as mem:
                        rewards, t = timed(lambda: [reference.score_files(prompt, ctx, c) for c in cands], dev)
                    results["naive"] = (rewards, t, mem.peak_mb, None)
                with PeakMemory(dev) as mem:
                    out, t = timed(lambda: model.score_batch([(prompt, ctx, c) for c in cands]), dev)
                results["batch"] = ([r.reward for r in out], t, mem.peak_mb, sum(r.num_tokens for r in out))
                with PeakMemory(dev) as mem:
                    out, t = timed(lambda: model.score_group(prompt, ctx, cands), dev)
                results["group"] = ([r.reward for r in out], t, mem.peak_mb, sum(r.num_tokens for r in out))
                tokens = results["batch"][3]
                base = results.get("naive")
                for path, (rewards, t, peak, _) in results.items():
                    rows.append(
                        Row(
                            context_s=ctx_s,
                            group=g,
                            path=path,
                            seconds_per_group=t,
                            candidates_per_s=g / t,
                            tokens_per_s=tokens / t,
                            peak_mem_mb=peak,
                            speedup_vs_naive=(base[1] / t) if base else math.nan,
                            max_abs_diff_vs_naive=max(abs(a - b) for a, b in zip(rewards, base[0])) if base else math.nan,
                        )
                    )
    return {
        "arch": arch,
        "device": str(dev),
        "device_name": device_name(dev),
        "threads": torch.get_num_threads(),
        "clip": {"fps": fps, "height": size[0], "width": size[1], "codec": "h264"},
        "preprocessing": prep,
        "rows": [asdict(r) for r in rows],
    }


def format_table(report: dict) -> str:
    lines = [
        f"arch={report['arch']} device={report['device']} ({report['device_name']}), torch threads={report['threads']}",
        f"clips: {report['clip']['width']}x{report['clip']['height']} @ {report['clip']['fps']} fps h264",
    ]
    p = report["preprocessing"]
    if p:
        lines.append(
            f"preprocessing: naive {p['naive_frames_per_s']:.1f} frames/s, pooled ({p['workers']} workers) "
            f"{p['pooled_frames_per_s']:.1f} frames/s = {p['speedup']:.2f}x, bit-identical={p['bit_identical']}"
        )
    lines.append("| context | G | path | s/group | cand/s | tokens/s | peak MB | vs naive | max |Δr| |")
    lines.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in report["rows"]:
        lines.append(
            f"| {r['context_s']} s | {r['group']} | {r['path']} | {r['seconds_per_group']:.3f} | {r['candidates_per_s']:.2f} | "
            f"{r['tokens_per_s']:.0f} | {r['peak_mem_mb']:.0f} | {r['speedup_vs_naive']:.2f}x | {r['max_abs_diff_vs_naive']:.3g} |"
        )
    return "\n".join(lines)
