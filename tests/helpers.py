"""Helpers shared by the test modules (imported as ``helpers``; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import math
import os


def bf16_ulp(x: float) -> float:
    """One unit in the last place of a bfloat16 value of magnitude |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


def ulps(a: float, b: float) -> float:
    """|a - b| in bf16 ulps of the larger magnitude."""
    return abs(a - b) / bf16_ulp(max(abs(a), abs(b)))


def exit_job(state, code: int) -> None:
    """A worker job that kills its worker process (for crash-recovery tests)."""
    os._exit(code)


def exit_once_job(state, marker: str) -> str:
    """Kills its worker the first time (creating ``marker``), succeeds when run again."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return "second try"


def echo_job(state, value):
    """Returns its argument and the worker's pid."""
    return value, os.getpid()


# Measured agreement with score() (README, "Fidelity"): a 36-layer bundle on CPU showed up to 7 bf16
# ulps for score_group and 3 for score_batch; an H200 at the 4B shapes showed 6 and 2.
GROUP_ULPS = 8
BATCH_ULPS = 4


def release_files():
    """The vendored Qwen3-VL-4B-Instruct release files (tests/data/qwen3-vl-4b-instruct)."""
    from pathlib import Path

    return Path(__file__).parent / "data" / "qwen3-vl-4b-instruct"
