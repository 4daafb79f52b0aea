"""verl 0.9.1 itself calls nvrm's verl functions, in URL mode and in process (part of ``make test``;
alone: ``make test-trainers``).

verl needs transformers 5 (``>=5.5.3,<5.11``), so it gets an environment of its own: torch 2.14.1 and
torchvision 0.29.1 (this machine's local wheels), verl 0.9.1 and nvrm built from this checkout, with
every other dependency from the package registry as pip resolves them together (transformers 5.10.4;
about 6.6 GB installed, 0.3 GB downloaded, about 3 minutes on 2 cores); ``pip check`` must be clean.
The venv is cached outside the clone (``NVRM_TEST_ENVS``, keyed by what it installs; see
``tests/overlays.py``); ``NVRM_VERL_ENV=DIR`` puts it elsewhere.

- verl's loader finds ``compute_score`` by file path and its reward loop's ``NaiveRewardManager``
  scores through an ``nvrm serve`` started from this project's environment (URL mode), and in
  process on the demo bundle (transformers 5.10.4 there): the rewards equal the release profile's
  (4.57.6, this environment) bit for bit.
- verl's real ``RewardLoopManager`` runs the in-process scorer inside its Ray reward worker.
- verl's legacy ``BatchRewardManager`` scores through ``compute_score_batch`` with the numpy object
  arrays it passes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from helpers import Server
from helpers import run_checked as run
from overlays import building, env_key, install, matrix_dir

pytestmark = [pytest.mark.trainers, pytest.mark.exclusive]  # verl's Ray workers each load the scorer

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROMPT = "A square glides across a tiled floor."


VERL = ["torch==2.14.1", "torchvision==0.29.1", "verl==0.9.1"]


@pytest.fixture(scope="module")
def verl_env(tmp_path_factory):
    import tomllib

    nvrm_deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]  # resolved with verl's
    venv = Path(os.environ.get("NVRM_VERL_ENV") or matrix_dir() / env_key("verl-venv", [VERL, nvrm_deps]))
    py = venv / "bin" / "python"
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)], cwd=ROOT)
    [wheel] = dist.glob("nvrm-*.whl")
    with building(venv):
        if not (venv / ".complete").is_file():
            run([sys.executable, "-m", "venv", "--clear", str(venv)])
            install(py, [*VERL, str(wheel)], timeout=2400)
            (venv / ".complete").write_text("\n".join(VERL))
        install(py, ["--reinstall-package", "nvrm", "--no-deps", str(wheel)])  # this checkout's code
    run([str(py), "-m", "pip", "check"])
    return py


@pytest.fixture(scope="module")
def want(demo):
    """The release profile's rewards (transformers 4.57.6, this environment) for 'a' and 'b'."""
    model, ctx, cands = demo
    rewards = [r.reward for r in model.score_group(PROMPT, ctx, [cands["smooth"], cands["frozen"]])]
    assert rewards[0] > rewards[1]  # the reward follows what the policy wrote
    return rewards


@pytest.fixture(scope="module")
def server(demo):
    model, ctx, _ = demo
    s = Server(model.path, "--allow-dir", str(ctx.parent))
    yield s
    s.stop()


def _callsite(py, script: str, model_or_url: str, demo, tmp_path, timeout: int = 600) -> dict:
    _, ctx, cands = demo
    out = run([str(py), str(HERE / script), model_or_url, str(ctx), str(cands["smooth"]), str(cands["frozen"])], cwd=tmp_path, timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["url", "in_process"])
def test_verl_loader_and_reward_manager_score_through_nvrm(verl_env, demo, want, server, mode, tmp_path):
    model_or_url = server.url if mode == "url" else str(demo[0].path)
    out = _callsite(verl_env, "verl_callsite.py", model_or_url, demo, tmp_path)
    assert out["verl"] == "0.9.1" and out["transformers"].startswith("5.10.")
    assert out["in_process"] == (mode == "in_process")
    assert out["scores"] == [want[0], want[1], want[0], want[1]] and out["ok"] == [1.0] * 4
    assert "RewardFnError" in out["missing_prompt"] and "extra_info['prompt']" in out["missing_prompt"]


def test_verl_reward_loop_runs_the_in_process_scorer_in_its_ray_worker(verl_env, demo, want, tmp_path):
    out = _callsite(verl_env, "verl_loop_callsite.py", str(demo[0].path), demo, tmp_path, timeout=900)
    assert out["scores"] == [want[0], want[1]] * 4 and out["rest_zero"]
    # the demo bundle has a guard: each sample also carries its raw reward and uncertainty (verl's reward_extra_info)
    assert out["ok"] == [1.0] * 8 and out["extra_keys"] == ["score", "nvrm_ok", "nvrm_off_contract", "nvrm_revision", "nvrm_raw_reward",
                                                            "nvrm_uncertainty"]
    assert out["renderers"] and out["driver"] not in out["renderers"]  # scored inside the reward worker
    assert out["torch"].startswith("2.14.1")


def test_verl_legacy_batch_reward_manager_scores_through_compute_score_batch(verl_env, demo, want, server, tmp_path):
    out = _callsite(verl_env, "verl_batch_callsite.py", server.url, demo, tmp_path)
    assert out["types"]["data_sources"] == "ndarray" and out["types"]["extra_infos"] == "ndarray"  # what verl passes
    assert out["four"] == [[want[0], 0.0], [want[1], 0.0], [want[0], 0.0], [want[1], 0.0]]
    assert out["four_extra"]["score"] == [want[0], want[1], want[0], want[1]] and out["four_extra"]["nvrm_ok"] == [1.0] * 4
    assert len(set(out["four_extra"]["nvrm_revision"])) == 1 and out["four_extra"]["nvrm_revision"][0]  # one revision scored the step
    assert out["one"] == [[want[1], 0.0]]
    assert "RewardFnError" in out["missing_prompt"] and "extra_info['prompt']" in out["missing_prompt"]
    assert out["mismatch"].startswith("ConfigError: compute_score_batch: 2 solution_strs but 1 extra_infos"), out["mismatch"]
