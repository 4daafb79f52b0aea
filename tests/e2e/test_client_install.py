"""The torch-free client installs beside a trainer's own torch and transformers, and scores through a server.

A throwaway venv gets torch 2.13 (CPU) and transformers 5 (what verl 0.9 and current trainers need),
then the nvrm-client wheel built from this checkout, all offline from the machine's local registry
(the wheel cache and the file indexes pip is configured with here). ``pip check`` must be clean, the
trainer's versions must be untouched, and the URL-mode flow-GRPO adapter must score generated
videos through an ``nvrm serve`` started from this project's own environment, with the rewards the
in-process model gives.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import Server
from helpers import run_checked as run
from overlays import install
from nvrm import Clip

ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path("/opt/wheels")
INDEXES = [Path("/opt/pypi/simple"), Path("/opt/pypi-more/simple")]
TRAINER = ["torch==2.13.0", "transformers==5.18.0"]

SCRIPT = r"""
import json, sys
import numpy as np, torch, transformers
from nvrm.rl import flow_grpo_reward
videos = torch.from_numpy(np.load(sys.argv[3]))  # [B, T, C, H, W] float32 in [0, 1]
scores, info = flow_grpo_reward(sys.argv[1], fps=1.0, on_error="group_mean")("cpu")(videos, ["p", "p", "p"], [{"context_video": sys.argv[2]}] * 3)
heavy = sorted(m for m in ("nvrm.scoring.reward_model", "nvrm.engine", "av", "qwen_vl_utils") if m in sys.modules)
print(json.dumps({"scores": scores, "failed": info["nvrm_failed"], "torch": torch.__version__, "transformers": transformers.__version__, "heavy": heavy}))
"""


@pytest.fixture(scope="module")
def trainer_env(tmp_path_factory):
    if not (WHEELS.is_dir() and all(i.is_dir() for i in INDEXES)):
        pytest.skip("this machine has no local package registry (/opt/wheels, /opt/pypi*)")
    tmp = tmp_path_factory.mktemp("trainer-env")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"), str(ROOT / "client")], cwd=ROOT / "client")
    [wheel] = (tmp / "dist").glob("nvrm_client-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    offline = ["--index-url", INDEXES[0].as_uri(), "--extra-index-url", INDEXES[1].as_uri(), "--find-links", str(WHEELS)]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}  # only the local registry, whatever pip.conf says
    install(py, TRAINER, offline=True, timeout=1200)  # the trainer's own stack (uv: the same packages, faster)
    run([str(py), "-m", "pip", "install", "-q", "--no-compile", *offline, str(wheel)], env=env, timeout=600)  # the client, as a user installs it
    return py


def test_client_installs_beside_torch_2_13_and_transformers_5(trainer_env):
    assert "No broken requirements" in run([str(trainer_env), "-m", "pip", "check"])
    versions = run([str(trainer_env), "-c", "import torch, transformers, nvrm; print(torch.__version__, transformers.__version__, nvrm.__version__)"]).split()
    import nvrm

    assert versions[0].startswith("2.13.0") and versions[1] == "5.18.0" and versions[2] == nvrm.__version__
    names = run([str(trainer_env), "-m", "pip", "list", "--format=json"])
    assert "nvidia" not in names  # no CUDA stack came along


def test_url_mode_adapter_in_the_trainer_env_scores_like_the_model(trainer_env, tiny_bundle, model, clips, tmp_path):
    rng = np.random.default_rng(5)
    videos = rng.random((3, 6, 3, 32, 48), dtype=np.float32)  # 6 s at 1 fps
    videos[1, 2, 0, 0, 0] = np.nan  # one broken sample: filled with its group's mean, not NaN
    np.save(tmp_path / "videos.npy", videos)
    server = Server(tiny_bundle, "--allow-dir", clips["context"].parent)
    try:
        out = json.loads(
            run([str(trainer_env), "-c", SCRIPT, server.url, str(clips["context"]), str(tmp_path / "videos.npy")], timeout=300).strip().splitlines()[-1]
        )
    finally:
        server.stop()
    assert out["torch"].startswith("2.13.0") and out["transformers"] == "5.18.0" and out["heavy"] == []
    frames = {i: np.round(np.clip(videos[i], 0, 1) * 255).astype(np.uint8).transpose(0, 2, 3, 1) for i in (0, 2)}
    want = [model.score("p", clips["context"], Clip(frames[i], 1.0)).reward for i in (0, 2)]
    assert out["failed"] == [1]
    assert [out["scores"][0], out["scores"][2]] == want
    assert out["scores"][1] == pytest.approx(sum(want) / 2)


def test_in_process_use_without_the_runtime_says_what_to_install(trainer_env, tiny_bundle):
    """nvrm-client has no av, qwen_vl_utils or the scoring engine: a bundle path is one line naming the fix."""
    code = (
        "import sys\n"
        "from nvrm.errors import ConfigError\n"
        "from nvrm.rl.verl import compute_score\n"
        "try:\n"
        "    compute_score('video', 'x', None, {'prompt': 'p', 'context_video': 'c.mp4'}, model=sys.argv[1])\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
    )
    out = run([str(trainer_env), "-c", code, str(tiny_bundle)], timeout=300).strip().splitlines()
    assert len(out) == 1, out
    assert "needs nvrm's runtime" in out[0] and "is not installed here" in out[0] and "nvrm serve" in out[0], out[0]
