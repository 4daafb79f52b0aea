"""What every benchmark workload shares: bundles, timing, memory, FLOPs, device facts.

Numbers are only comparable within one run (the machines are shared and
noisy): every workload runs the paths it compares side by side, on the same
inputs, in one process, and reports their ratios.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..bundle import cache_dir

# Measured dense bf16 matmul rates (TFLOP/s) used as "the device's peak" when
# no measurement is asked for; H200: ../shared/notes/gpu.md.
KNOWN_PEAK_TFLOPS = {"H200": 790.0}


def build_bench_bundle(arch: str) -> Path:
    """A random-weight bundle in the release layout, cached by architecture (tiny, mid, 4b)."""
    from ..synth.bundles import ArchSpec, build_tiny_bundle

    spec = ArchSpec.from_name(arch)
    path = cache_dir() / f"bench-bundle-{arch}"
    if not (path / "RELEASE_MANIFEST.json").is_file():
        build_tiny_bundle(path, spec, revision=f"bench-{arch}", label=f"nvrm random-weight benchmark bundle ({arch})")
    return path


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """(result, wall seconds), with the device synchronised on both sides."""
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t


class PeakMemory:
    """Peak extra memory while a block runs: CUDA allocator peak, else sampled RSS (a lower bound)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_mb = 0.0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        self._base = self._peak = _rss()
        self._stop = threading.Event()

        def sample():
            while not self._stop.wait(0.005):
                self._peak = max(self._peak, _rss())

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mb = (torch.cuda.max_memory_allocated() - self._base) / 2**20
        else:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, _rss())
            self.peak_mb = (self._peak - self._base) / 2**20


def _rss() -> int:
    """Resident set size in bytes, from /proc (no extra dependency)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        return 0


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"cpu x{os.cpu_count()}"


def peak_tflops(device: torch.device, measure: bool = False) -> float | None:
    """The device's dense bf16 rate: measured with a large matmul, or from the known table; None on CPU."""
    if device.type != "cuda":
        return None
    if not measure:
        name = torch.cuda.get_device_name(device)
        for key, value in KNOWN_PEAK_TFLOPS.items():
            if key in name:
                return value
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _, t = timed(lambda: [a @ b for _ in range(20)], device)
    return 2 * n**3 * 20 / t / 1e12


def forward_flops(config, text_rows: list[tuple[int, int]], images: list[tuple[int, int, int]]) -> float:
    """Matmul FLOPs of a forward: ``text_rows`` are (new tokens, keys already cached) per row; ``images`` their grids.

    Counts the projections, MLPs and attention score/value products of the
    language model and the vision tower (patch embedding and mergers
    included); elementwise work is left out.
    """
    t = config.text_config
    hd = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    q, kv = t.num_attention_heads * hd, t.num_key_value_heads * hd
    per_token = 2 * t.hidden_size * (2 * q + 2 * kv) + 2 * 3 * t.hidden_size * t.intermediate_size
    flops = 0.0
    for new, cached in text_rows:
        attended = new * cached + new * (new + 1) / 2  # causal: token j sees cached + j + 1 keys
        flops += t.num_hidden_layers * (new * per_token + 2 * 2 * q * attended)
    v = config.vision_config
    d, m2 = v.hidden_size, v.spatial_merge_size**2
    per_patch = 2 * d * 3 * d + 2 * d * d + 2 * 2 * d * v.intermediate_size
    merger = 2 * (m2 * d) * (m2 * d) + 2 * (m2 * d) * v.out_hidden_size  # per merged token
    in_dim = 3 * v.temporal_patch_size * v.patch_size**2
    for gt, gh, gw in images:
        frame = gh * gw
        n = gt * frame
        flops += 2 * in_dim * d * n + v.depth * (n * per_patch + 2 * 2 * d * frame * n)
        flops += (n / m2) * merger * (1 + len(v.deepstack_visual_indexes))
    return flops


def clean_json(report: dict) -> str:
    """Strict JSON: NaN and inf become null."""

    def clean(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    return json.dumps(clean(report))
