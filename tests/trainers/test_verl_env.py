"""verl 0.9.1 itself calls nvrm's verl functions (part of ``make test``; alone: ``make test-trainers``).

verl needs transformers 5, so it gets an environment of its own: torch 2.13 (CPU, local wheel),
verl 0.9.1 and its dependencies from the package registry (about 2 GB, a few minutes), and the
nvrm-client wheel built from this checkout. verl's ``get_custom_reward_fn`` loads ``nvrm/rl/verl.py``
by path and its ``NaiveRewardManager`` scores through an ``nvrm serve`` started from this project's
environment, in URL mode. It downloads verl's dependencies from the registry (about 3 minutes on a
2-core machine); ``NVRM_VERL_ENV=DIR`` keeps and reuses that environment.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from helpers import Server
from helpers import run_checked as run

pytestmark = pytest.mark.trainers

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def verl_env(tmp_path_factory):
    venv = Path(os.environ.get("NVRM_VERL_ENV", tmp_path_factory.mktemp("verl") / "venv"))
    py = venv / "bin" / "python"
    if not py.exists():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(py), "-m", "pip", "install", "-q", "--find-links", "/opt/wheels", "torch==2.13.0", "verl==0.9.1"], timeout=1800)
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT / "client")], cwd=ROOT / "client")
    wheels = [str(w) for w in dist.glob("*.whl")]
    run([str(py), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", *wheels])  # this checkout's code
    run([str(py), "-m", "pip", "install", "-q", *wheels])  # and the client's own dependencies, beside verl's
    run([str(py), "-m", "pip", "check"])
    return py


def test_verl_loader_and_reward_manager_score_through_nvrm(verl_env, demo, tmp_path):
    model, ctx, cands = demo
    server = Server(model.path, "--allow-dir", str(ctx.parent))
    try:
        out = json.loads(run([str(verl_env), str(ROOT / "tests/trainers/verl_callsite.py"), server.url, str(ctx), str(cands["smooth"]), str(cands["frozen"])],
                             cwd=tmp_path, timeout=600).strip().splitlines()[-1])
    finally:
        server.stop()
    assert out["verl"] == "0.9.1"
    want = [r.reward for r in model.score_group("A square glides across a tiled floor.", ctx, [cands["smooth"], cands["frozen"]])]
    assert out["scores"] == [want[0], want[1], want[0], want[1]] and out["ok"] == [1.0] * 4
    assert want[0] > want[1]  # the reward follows what the policy wrote
    assert "RewardFnError" in out["missing_prompt"] and "extra_info['prompt']" in out["missing_prompt"]
