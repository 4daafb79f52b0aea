"""The command answers at once (issue 55, item 8): ``nvrm --help``, ``nvrm SUB --help``, ``nvrm verify`` and
``nvrm download`` import neither torch nor transformers. Each case runs ``nvrm.cli.main.main`` in a fresh
interpreter and reports what it imported; how long it takes is measured in BENCHMARKS.md, not here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "torchvision", "qwen_vl_utils")

# runs main(argv) as `nvrm` would; with a bundle folder as NVRM_FAKE_HUB, huggingface_hub's snapshot_download copies it
# (nvrm download without a network); prints the exit code and the heavy modules it left imported
WRAPPER = f"""
import contextlib, io, json, os, shutil, sys
if os.environ.get("NVRM_FAKE_HUB"):
    import huggingface_hub

    def snapshot_download(repo_id, revision=None, local_dir=None, **kwargs):
        shutil.copytree(os.environ["NVRM_FAKE_HUB"], local_dir)
        return local_dir

    huggingface_hub.snapshot_download = snapshot_download
from nvrm.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        rc = main(sys.argv[1:])
    except SystemExit as e:
        rc = e.code
print(json.dumps({{"rc": rc, "out": out.getvalue(), "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def run(*argv: str, env: dict[str, str] | None = None) -> dict:
    import os

    proc = subprocess.run([sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory) -> Path:
    """The embedded demo bundle (a release-layout bundle with its manifest), copied: built without torch."""
    from nvrm.cli.demo import demo_bundle_path

    out = tmp_path_factory.mktemp("startup") / "demo-bundle"
    shutil.copytree(demo_bundle_path(), out)
    return out


@pytest.mark.parametrize("argv", [
    ["--help"], ["score", "--help"], ["verify", "--help"], ["download", "--help"], ["serve", "--help"], ["train", "--help"],
    ["guard", "--help"], ["guard", "fit", "--help"], ["prefs", "judge", "--help"], ["refresh", "--help"],
])
def test_help_imports_no_torch(argv):
    got = run(*argv)
    assert got["rc"] == 0 and "usage: nvrm" in got["out"]
    assert got["heavy"] == [], f"nvrm {' '.join(argv)} imported {got['heavy']}"


def test_verify_imports_no_torch(demo_bundle):
    got = run("verify", str(demo_bundle))
    assert got["rc"] == 0 and "OK, " in got["out"], got
    assert got["heavy"] == [], got["heavy"]


def test_download_imports_no_torch(demo_bundle, tmp_path):
    got = run("download", "--repo", "nvidia/WORL-NVRM", "--local-dir", str(tmp_path / "got"), env={"NVRM_FAKE_HUB": str(demo_bundle)})
    assert got["rc"] == 0 and "file(s) verified" in got["out"], got
    assert got["heavy"] == [], got["heavy"]


def test_every_subcommand_has_its_flags_when_built_whole():
    """``build_parser()`` (what the docs' flag check reads) adds every flag at once, nested ones included."""
    import argparse

    from nvrm.cli.main import SUBCOMMANDS, build_parser

    def subparsers(parser):
        return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})

    top = subparsers(build_parser())
    assert set(top) == {name for name, *_ in SUBCOMMANDS}
    assert "--model" in {o for a in top["score"]._actions for o in a.option_strings}
    fit = subparsers(top["guard"])["fit"]
    assert {"--pairs", "--model"} <= {o for a in fit._actions for o in a.option_strings}
