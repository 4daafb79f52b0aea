"""The release's rewards on every supported transformers: the version matrix (part of ``make test``).

The release profile is transformers 4.57.6 (this environment). Each other version runs on the same
torch build (``tests/overlays.py``), and

- ``probe.py`` writes every path's numbers there (``score``, packed and exact ``score_batch``,
  prefix-KV ``score_group`` and ``score_groups``, the differentiable reward's value and gradient,
  and token ids, positions, pixel values and vision features), which must equal the release
  profile's, computed by 4.57.6 on this machine in the same test run, bit for bit;
- the numerics tests run there too (group and batch equality, the differentiable reward, the
  owned arithmetic against that transformers), and the RL adapters' tests, TRL 1.16's real
  ``GRPOTrainer`` step among them: TRL in process on transformers 5; and the load-time self-check's
  tests (``tests/unit/test_selfcheck.py``: the token ids and pixel values 4.57.6 recorded).

The matrix holds the newest transformers on the registry (checked with ``pip index versions transformers``):
a new release replaces the previous newest rather than adding a fifth version, so ``make test`` takes no longer.

Tests that compare against transformers' own forward run only where it shares 4.57.6's numerics:
5.8.1 runs them (the last release before 5.9 changed the vision interpolation).
``make test-versions`` runs this file alone; ``NVRM_MATRIX_DIR`` keeps the overlays elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlays import ROOT, env_with, overlay

pytestmark = pytest.mark.versions

MATRIX = {
    "5.8.1": "the last release with 4.57.6's vision numerics: its own forward is a reference too",
    "5.9.0": "the first with the float32 interpolation sum; verl's vllm extra pins it",
    "5.10.4": "inside verl 0.9.1's range",
    "5.25.0": "the newest release on the registry (5.24.0 held this place until 5.25.0 came out)",
}
NUMERIC_TESTS = [
    "tests/integration/test_compat.py",
    "tests/integration/test_group.py",
    "tests/integration/test_differentiable.py",
    "tests/integration/test_golden.py",
    "tests/integration/test_parity.py",
    "tests/integration/test_no_context.py",
    "tests/e2e/test_adapters.py",
    "tests/unit/test_selfcheck.py",  # the load-time self-check's fingerprints, recorded under 4.57.6, hold here too
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_bundle):
    """Bundles (written once, by this environment) and clips every version scores."""
    from nvrm.cli.demo import demo_bundle_path, write_demo_clips
    from nvrm.synth.bundles import ArchSpec, build_release_bundle, build_tiny_bundle
    from helpers import release_files

    d = tmp_path_factory.mktemp("matrix")
    clips = d / "clips"
    clips.mkdir()
    ctx, cands = write_demo_clips(clips)
    for name, path in [("context", ctx), *cands.items()]:
        if path.parent != clips or path.stem != name:
            (clips / f"{name}.mp4").write_bytes(Path(path).read_bytes())
    bundles = [
        demo_bundle_path(),
        tiny_bundle,
        build_tiny_bundle(d / "mid", ArchSpec.from_name("mid"), revision="mid-matrix"),
        build_release_bundle(d / "release-shaped", release_files()),
    ]
    return clips, bundles


def _probe(out: Path, clips: Path, bundles, env=None) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "tests/versions/probe.py"), str(out), str(clips), *map(str, bundles)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def release_profile(inputs, tmp_path_factory):
    import transformers

    assert transformers.__version__ == "4.57.6", "the main environment is the release profile"
    clips, bundles = inputs
    return _probe(tmp_path_factory.mktemp("profile") / "4.57.6.json", clips, bundles)


def _differences(a, b, where="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: missing" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _differences(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


@pytest.mark.parametrize("version", list(MATRIX), ids=list(MATRIX))
def test_every_path_gives_the_release_numbers(version, inputs, release_profile, tmp_path):
    target = overlay([f"transformers=={version}"], f"transformers-{version}")
    clips, bundles = inputs
    got = _probe(tmp_path / f"{version}.json", clips, bundles, env=env_with(target))
    assert got["transformers"] == version and got["torch"] == release_profile["torch"]
    diff = _differences(release_profile["bundles"], got["bundles"])
    assert not diff, f"transformers {version} differs from the release profile (4.57.6) in {len(diff)} places:\n" + "\n".join(diff[:20])


@pytest.mark.parametrize("version", list(MATRIX), ids=list(MATRIX))
def test_the_numerics_and_trainer_tests_pass(version):
    target = overlay([f"transformers=={version}"], f"transformers-{version}")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *NUMERIC_TESTS],
        env=env_with(target), capture_output=True, text=True, cwd=ROOT, timeout=1800,
    )
    tail = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, f"under transformers {version}:\n{tail}"
    assert f"transformers {version} no longer computes" in tail or version == "5.8.1", tail  # the reference tests skip past 5.8
    if version == "5.8.1":
        assert "skipped" not in proc.stdout.strip().splitlines()[-1], tail  # ... and run on 5.8.1
