"""Helpers shared by the test modules (imported as ``helpers``; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os


from nvrm.numerics import BATCH_DRIFT_ULPS, GROUP_DRIFT_ULPS, bf16_ulp, ulps  # noqa: F401 - one source for the bounds


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


# The drift bounds live in nvrm.numerics (measured by bench/drift_sweep.py; README "Fidelity").
GROUP_ULPS = GROUP_DRIFT_ULPS
BATCH_ULPS = BATCH_DRIFT_ULPS


def release_files():
    """The vendored Qwen3-VL-4B-Instruct release files (tests/data/qwen3-vl-4b-instruct)."""
    from pathlib import Path

    return Path(__file__).parent / "data" / "qwen3-vl-4b-instruct"
