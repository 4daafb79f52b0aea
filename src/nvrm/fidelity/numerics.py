"""Where a reward's last bits come from: the machine, its CPU capability and bf16 ulps.

bf16 rewards are reproducible on the machine that computes them, not across
machines: ATen picks its vector kernels by CPU capability (``default``,
``avx2``, ``avx512``; set with ``ATEN_CPU_CAPABILITY``) and the matmul
libraries pick theirs by CPU, so a reward can move by an ulp between an AMD
AVX2 machine and an Intel AVX-512 one. The promises are therefore:

- ``score`` equals the plain reference bit for bit *on the machine that runs both*;
- preprocessing (tokens, pixel values, grids, times) is identical everywhere;
- ``score_group`` and ``score_batch`` differ from ``score`` by at most
  ``GROUP_DRIFT_ULPS`` and ``BATCH_DRIFT_ULPS`` bf16 ulps, bounds measured over
  a sweep of capabilities, thread counts and inputs (README, "Fidelity";
  ``benchmarks/drift_sweep.py``; BENCHMARKS.md, "Drift sweep").
"""

from __future__ import annotations

import math
import os
import platform

CAPABILITIES = ("default", "avx2", "avx512")
"""ATen's CPU capabilities on x86-64, lowest first (``ATEN_CPU_CAPABILITY``)."""

# The bounds every test imports. Measured maxima and the sweep that measured them: README "Fidelity".
GROUP_DRIFT_ULPS = 8
"""score_group vs score, bf16 ulps of the larger magnitude (prefix KV reuse reorders reductions)."""
BATCH_DRIFT_ULPS = 8
"""score_batch vs score, bf16 ulps (right padding sends attention through a masked kernel)."""
GOLDEN_PORTABLE_ULPS = 2
"""A golden reward recorded on one machine vs the same input on another (different matmul kernels)."""

_NEEDS = {"avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq")}


def bf16_ulp(x: float) -> float:
    """One unit in the last place of a bfloat16 value of magnitude |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


def ulps(a: float, b: float) -> float:
    """|a - b| in bf16 ulps of the larger magnitude."""
    return abs(a - b) / bf16_ulp(max(abs(a), abs(b)))


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``); empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def supported_capabilities() -> list[str]:
    """The ATen CPU capabilities this machine can run, lowest first (``default`` always)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ["default"]
    flags = cpu_flags()
    return ["default"] + [cap for cap in ("avx2", "avx512") if all(f in flags for f in _NEEDS[cap])]


def current_capability() -> str:
    """The capability ATen runs with in this process (after ``ATEN_CPU_CAPABILITY``)."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability()).lower()


def machine_info() -> dict[str, object]:
    """What a recorded bf16 value depends on: CPU model, capability, threads and library versions."""
    import torch

    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": model,
        "machine": platform.machine(),
        "cpu_capability": current_capability(),
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
