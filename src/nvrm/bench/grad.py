"""``nvrm bench --workload grad``: the differentiable reward's cost against the forward alone.

One group of G candidates (float frames in [0, 1], 81 at 16 fps by default, Wan's layout) after
one context, measured side by side in one run:

- forward alone (no graph), the prefix already prefilled, as a trainer's later steps find it;
- forward + backward with activation checkpointing (the default) and without;
- peak memory of each (the CUDA allocator's peak; on the CPU the kernel's resident high-water mark,
  reset before each run after freed heap is returned) and the bytes autograd keeps for the backward
  pass (saved tensors, exact on any device);
- the surrogate's pixel error against the exact contract frames (0-255 levels).

``grad_memory_4b`` computes (not measures) what a group needs at the release's 4B shapes.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from .harness import PeakMemory, build_bench_bundle, device_name, sync


def _trim() -> None:
    """Give freed heap memory back to the OS (glibc), so a later peak is not hidden by reuse."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # pragma: no cover - not glibc
        pass


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0  # pragma: no cover


def cpu_peak_mb(fn) -> float:
    """Peak resident memory above the start while ``fn`` runs: the kernel's high-water mark, reset first
    (``/proc/self/clear_refs``), after returning freed heap to the OS."""
    _trim()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_mb("VmRSS")
    fn()
    return _status_mb("VmHWM") - base


class SavedBytes:
    """Bytes of the tensors autograd saves for the backward pass while the block runs (counted once each)."""

    def __init__(self):
        self.bytes = 0
        self._seen: set[int] = set()

    def _pack(self, t: torch.Tensor):
        key = t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)
        if key not in self._seen:
            self._seen.add(key)
            self.bytes += t.untyped_storage().nbytes()
        return t

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def surrogate_error(scorer, frames: torch.Tensor, fps: float) -> dict[str, float]:
    """Max and mean |surrogate - exact| over every sampled frame, in 0-255 levels."""
    from ..scoring.differentiable import surrogate

    sampled, prepared, _ = scorer.prepare_candidates(frames, fps)
    worst, total, n = 0.0, 0.0, 0
    for b, video in enumerate(prepared):
        for k, im in enumerate(video.images):
            exact = torch.from_numpy(np.array(im)).float()
            s = surrogate(sampled[b, k : k + 1].detach().float().clamp(0, 1) * 255, (im.height, im.width), scorer.model.contract)[0].cpu()
            d = (s - exact).abs()
            worst, total, n = max(worst, float(d.max())), total + float(d.sum()), n + d.numel()
    return {"max": worst, "mean": total / max(n, 1)}


def run_grad(arch: str = "mid", G: int = 4, frames: int = 81, fps: float = 16.0, size: tuple[int, int] = (240, 416),
             context_s: float = 4.0, device: str | None = None, repeats: int = 3) -> dict[str, Any]:
    from ..clip import Clip
    from ..scoring.reward_model import RewardModel

    bundle = build_bench_bundle(arch)
    model = RewardModel.from_pretrained(bundle, device=device)
    dev = model.device
    rng = np.random.default_rng(0)
    ctx = Clip(rng.integers(0, 256, (int(context_s * 4), size[0], size[1], 3), dtype=np.uint8), fps=4)
    from ..synth.clips import moving_square

    # smooth moving content (what a generator decodes), not noise: noise is the surrogate's worst case
    x = torch.from_numpy(np.stack([moving_square(frames, size[0], size[1], seed=10 + g, speed=1 + g) for g in range(G)])).permute(0, 1, 4, 2, 3)
    x = (x.float() / 255).to(dev)
    prompt = "A robot arm stacks the red block on the blue one."
    report: dict[str, Any] = {"workload": "grad", "arch": arch, "device": device_name(dev), "G": G, "frames": frames, "fps": fps, "size": list(size)}
    try:
        variants = {"checkpointing": model.differentiable(checkpointing=True), "no checkpointing": model.differentiable(checkpointing=False)}
        with torch.no_grad():
            variants["checkpointing"](prompt, ctx, x, fps=fps)  # prepares the context and prefills its prefix
        variants["no checkpointing"]._prefixes = variants["checkpointing"]._prefixes  # both find it prefilled
        variants["no checkpointing"]._contexts = variants["checkpointing"]._contexts

        def forward():
            with torch.no_grad():
                return variants["checkpointing"](prompt, ctx, x, fps=fps)

        xg = x.clone().requires_grad_()  # made once, with its gradient buffer (accumulated into): the
        xg.grad = torch.zeros_like(xg)  # runs below measure the scorer, not copies of the input

        def backward(name):
            def run():
                variants[name](prompt, ctx, xg, fps=fps).sum().backward()
            return run

        rows: dict[str, Any] = {}
        for name, fn in [("forward", forward), ("forward+backward, checkpointing", backward("checkpointing")),
                         ("forward+backward, no checkpointing", backward("no checkpointing"))]:
            best, peak = float("inf"), 0.0
            for _ in range(repeats):
                sync(dev)
                t = time.perf_counter()
                if dev.type == "cuda":
                    with PeakMemory(dev) as mem:
                        fn()
                    peak = max(peak, mem.peak_mb)
                else:
                    peak = max(peak, cpu_peak_mb(fn))
                sync(dev)
                best = min(best, time.perf_counter() - t)
            rows[name] = {"seconds": best, "peak_mb": peak}
        for name in ("checkpointing", "no checkpointing"):
            with SavedBytes() as saved:
                variants[name](prompt, ctx, xg, fps=fps)
            rows[f"forward+backward, {name}"]["saved_mb"] = saved.bytes / 2**20
        fwd = rows["forward"]["seconds"]
        for row in rows.values():
            row["vs_forward"] = row["seconds"] / fwd
        report["rows"] = rows
        report["surrogate_error_levels"] = surrogate_error(variants["checkpointing"], x, fps)
        report["computed_4b_g8"] = grad_memory_4b(G=8)
    finally:
        model.close()
    return report


def grad_memory_4b(G: int = 8, frames: int = 5, pixels: int = 76800, context_tokens: int = 1000) -> dict[str, float]:
    """Computed, not measured: GiB a G-candidate forward + backward needs at the release's 4B shapes
    (36 text layers of 2560, MLP 9728, 8 KV heads of 128; 24 vision blocks of 1024, MLP 4096), bf16."""
    b = 2  # bytes per bf16 value
    weights = 8.8
    patches = G * frames * pixels // 256  # 16 x 16 patches before the 2 x 2 merge
    tokens = G * (frames * pixels // 1024 + 24)  # merged image tokens and the closing text per candidate
    text_in = 36 * tokens * 2560 * b  # one saved input per checkpointed text layer
    vision_in = 24 * patches * 1024 * b
    text_layer = tokens * (2560 * 8 + 9728 * 3) * b + G * (context_tokens + tokens // G) * 8 * 128 * 2 * b  # activations + each row's KV
    vision_block = patches * (1024 * 6 + 4096 * 3) * b
    pixel_values = patches * 1536 * 4 * 2  # float32 values and their gradient
    prefix_kv = 36 * context_tokens * 8 * 128 * 2 * b
    gib = 2**30
    with_ckpt = weights + (text_in + vision_in + max(text_layer, vision_block) + pixel_values + prefix_kv) / gib
    without = weights + (36 * text_layer + 24 * vision_block + pixel_values + prefix_kv) / gib
    return {"G": G, "with_checkpointing_gib": round(with_ckpt, 1), "without_checkpointing_gib": round(without, 1), "label": "computed"}


def format_grad(report: dict[str, Any]) -> str:
    lines = [f"nvrm bench --workload grad  ({report['arch']} bundle, {report['device']}, G={report['G']}, "
             f"{report['frames']} frames at {report['fps']:g} fps, {report['size'][0]}x{report['size'][1]})", ""]
    lines.append(f"{'path':<36} {'seconds':>9} {'x forward':>10} {'peak MB':>9} {'saved MB':>9}")
    for name, row in report["rows"].items():
        saved = f"{row['saved_mb']:>9.0f}" if "saved_mb" in row else f"{'-':>9}"
        lines.append(f"{name:<36} {row['seconds']:>9.3f} {row['vs_forward']:>10.2f} {row['peak_mb']:>9.0f} {saved}")
    e = report["surrogate_error_levels"]
    lines.append("")
    lines.append(f"surrogate vs exact contract pixels: max {e['max']:.1f}, mean {e['mean']:.2f} (0-255 levels)")
    c = report["computed_4b_g8"]
    lines.append(f"4B shapes, G={c['G']} x 5 frames (computed, not measured): {c['with_checkpointing_gib']} GiB with checkpointing, "
                 f"{c['without_checkpointing_gib']} GiB without")
    return "\n".join(lines)
