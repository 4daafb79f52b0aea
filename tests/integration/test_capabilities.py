"""The numerics-sensitive tests again under every other CPU capability this machine supports.

ATen picks vector kernels by capability (``ATEN_CPU_CAPABILITY``: default, avx2, avx512), so a
machine can run three different sets of kernels. The promises (``score`` equals the reference on
the machine that runs both; group and batch drift within the stated bounds; ``exact=True``
bit-identical) must hold under each, so ``make test`` runs those tests once per capability, each in
a subprocess with the variable set. The main run covers the capability it runs with.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nvrm.fidelity.numerics import CAPABILITIES, current_capability, supported_capabilities

ROOT = Path(__file__).resolve().parents[2]
NUMERIC_TESTS = [
    "tests/integration/test_golden.py",
    "tests/integration/test_parity.py",
    "tests/integration/test_deep.py",
    "tests/integration/test_group.py",
]
INSIDE = "NVRM_CAPABILITY_MATRIX"


@pytest.mark.slow
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_numerics_hold_under_capability(capability):
    if os.environ.get(INSIDE):
        pytest.skip("already inside a capability run")
    if capability not in supported_capabilities():
        pytest.skip(f"this CPU cannot run ATen's {capability} kernels")
    if capability == current_capability():
        pytest.skip(f"the main run already runs with {capability}")
    # its own inductor cache: kernels (and their precompiled header) built under another capability must not be reused;
    # kept beside the test environments when there are such (make test), else fresh
    envs = os.environ.get("NVRM_TEST_ENVS")
    cache = os.path.join(envs, "inductor", capability) if envs else tempfile.mkdtemp(prefix=f"inductor-{capability}-")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, INSIDE: capability, "TORCHINDUCTOR_CACHE_DIR": cache}
    probe = subprocess.run(
        [sys.executable, "-c", "from nvrm.fidelity.numerics import current_capability as c; print(c())"],
        env=env, capture_output=True, text=True, cwd=ROOT,
    )
    assert probe.stdout.strip() == capability, probe.stderr[-2000:]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging", "-p", "no:hypothesispytest", *NUMERIC_TESTS],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=1800,
    )
    assert proc.returncode == 0, f"under ATEN_CPU_CAPABILITY={capability}:\n" + proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.strip().splitlines()[-1]
