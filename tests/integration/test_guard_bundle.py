"""The guard on a tiny bundle: rewards bit for bit unchanged, an uncertainty on every path, the sidecar file and its checks,
the conservative reward with gradients."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from nvrm import Clip, RewardModel
from nvrm.errors import BundleError, ConfigError, IntegrityError

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "A square glides across a tiled floor at constant speed."


def example(seed: int) -> dict[str, np.ndarray]:
    from nvrm.prefs.synthetic import make_example

    return make_example(seed)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, tiny_bundle):
    """A copy of the tiny bundle with a guard (``helpers.guarded_copy``: noisy copies stand in for hacked candidates)."""
    from helpers import guarded_copy

    folder = guarded_copy(tiny_bundle, tmp_path_factory.mktemp("guarded") / "tiny")
    m = RewardModel.from_pretrained(folder, device="cpu")
    yield m, folder
    m.close()


def test_the_guard_is_listed_in_the_manifest_and_loaded(guarded):
    m, folder = guarded
    manifest = json.loads((folder / "RELEASE_MANIFEST.json").read_text())
    assert "nvrm_guard.safetensors" in manifest["files"] and manifest["source"]["revision"] == "tiny-test-0001"
    assert m.guard is not None and m.guard.threshold >= 0


def test_rewards_are_bit_for_bit_the_same_with_and_without_a_guard_and_every_path_carries_an_uncertainty(guarded, model):
    m, _ = guarded
    ex = example(11)
    ctx = Clip(ex["context"], 4)
    cands = [Clip(ex[n], 4) for n in ("preferred", "freeze", "teleport")]
    for name, run in [
        ("score", lambda rm: [rm.score(PROMPT, ctx, c) for c in cands]),
        ("score_group", lambda rm: rm.score_group(PROMPT, ctx, cands)),
        ("score_group exact", lambda rm: rm.score_group(PROMPT, ctx, cands, exact=True)),
        ("score_batch", lambda rm: rm.score_batch([(PROMPT, ctx, c) for c in cands])),
        ("score_batch exact", lambda rm: rm.score_batch([(PROMPT, ctx, c) for c in cands], exact=True)),
    ]:
        with_guard, without = run(m), run(model)
        assert [r.reward for r in with_guard] == [r.reward for r in without], name
        assert all(r.uncertainty is None for r in without), name
        assert all(r.uncertainty is not None and r.uncertainty >= 0 for r in with_guard), name
    one = [m.score(PROMPT, ctx, c).uncertainty for c in cands]
    group = [r.uncertainty for r in m.score_group(PROMPT, ctx, cands)]
    assert group == pytest.approx(one, rel=1e-4, abs=1e-5)  # the same reading, whichever path scored it
    r = m.score(PROMPT, ctx, cands[1])
    assert r.conservative(2.0) == pytest.approx(r.reward - 2.0 * r.uncertainty)
    assert r.to_dict()["uncertainty"] == r.uncertainty


def test_the_conservative_differentiable_reward_is_raw_minus_lambda_uncertainty_with_a_gradient(guarded, model):
    m, _ = guarded
    ex = example(12)
    ctx = Clip(ex["context"], 4)
    frames = torch.tensor(ex["freeze"]).float().div(255).requires_grad_(True)
    scorer = m.differentiable(conservative=3.0)
    out = scorer(PROMPT, ctx, frames, fps=4)
    assert torch.allclose(out, scorer.raw - 3.0 * scorer.uncertainty)
    assert float(scorer.raw[0]) == m.score(PROMPT, ctx, Clip(ex["freeze"], 4)).reward  # the frames are uint8 already
    u_scored = m.score(PROMPT, ctx, Clip(ex["freeze"], 4)).uncertainty
    assert float(scorer.uncertainty[0]) == pytest.approx(u_scored, rel=1e-3, abs=1e-4)
    out.sum().backward()
    assert frames.grad is not None and float(frames.grad.abs().sum()) > 0
    with pytest.raises(ConfigError, match="no guard"):
        model.differentiable(conservative=1.0)


def test_a_changed_guard_fails_verification_and_a_foreign_one_is_refused_naming_both_fingerprints(guarded, tmp_path, tiny_bundle):
    from nvrm.bundle import write_manifest
    from nvrm.synth.bundles import ArchSpec, build_tiny_bundle

    _, folder = guarded
    tampered = tmp_path / "tampered"
    shutil.copytree(folder, tampered)
    data = bytearray((tampered / "nvrm_guard.safetensors").read_bytes())
    data[-1] ^= 1
    (tampered / "nvrm_guard.safetensors").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="nvrm_guard.safetensors sha256"):
        RewardModel.from_pretrained(tampered, device="cpu")
    other = build_tiny_bundle(tmp_path / "other", ArchSpec(seed=3))
    shutil.copy(folder / "nvrm_guard.safetensors", other / "nvrm_guard.safetensors")
    write_manifest(other, revision="other")
    with pytest.raises(BundleError, match=r"fitted for other weights \(guard [0-9a-f]{16}, bundle [0-9a-f]{16}\)") as e:
        RewardModel.from_pretrained(other, device="cpu")
    assert "\n" not in str(e.value)
    (other / "nvrm_guard.safetensors").write_bytes(b"\x00" * 64)
    write_manifest(other, revision="other")
    with pytest.raises(BundleError, match="not a readable guard file"):
        RewardModel.from_pretrained(other, device="cpu")


def test_an_opt_in_contract_scores_without_the_bundles_guard_and_says_so(guarded):
    """The guard was fitted under the bundle's own contract; a model loaded under an opt-in (short candidates) is not
    what it describes: that model loads and scores without it, with one warning, and refuses a conservative reward."""
    from nvrm import Contract

    model, folder = guarded
    with pytest.warns(UserWarning, match=r"fitted under the bundle's own contract \([0-9a-f]{16}\).*another \([0-9a-f]{16}\).*without a guard"):
        relaxed = RewardModel.from_pretrained(folder, device="cpu", contract=Contract(short_candidates=True))
    with relaxed:
        assert relaxed.guard is None and model.guard is not None
        ex = example(11)
        r = relaxed.score(PROMPT, Clip(ex["context"], 4), Clip(ex["preferred"], 4))
        assert r.uncertainty is None and np.isfinite(r.reward)
        with pytest.raises(ConfigError, match="has no guard"):
            relaxed.differentiable(conservative=1.0)


def test_the_demo_guard_script_refits_from_a_copy_without_the_shipped_guard(guarded, tmp_path):
    """scripts/fit_demo_guard.py's copy drops the shipped guard's file and its manifest entry, so the copy verifies and
    loads without a guard (before, the copy kept the entry and ``nvrm guard fit`` refused it as damaged)."""
    import importlib.util

    from nvrm.bundle import verify_bundle

    spec = importlib.util.spec_from_file_location("fit_demo_guard", ROOT / "scripts" / "fit_demo_guard.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    copy = tmp_path / "copy"
    shutil.copytree(guarded[1], copy)
    assert "nvrm_guard.safetensors" in (copy / "RELEASE_MANIFEST.json").read_text()
    script.drop_guard(copy)
    assert not (copy / "nvrm_guard.safetensors").exists()
    assert "nvrm_guard.safetensors" not in (copy / "RELEASE_MANIFEST.json").read_text()
    assert verify_bundle(copy).files_checked > 0  # raises IntegrityError on a listed file that is missing
    with RewardModel.from_pretrained(copy, device="cpu") as m:
        assert m.guard is None
