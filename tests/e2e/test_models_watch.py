"""``nvrm serve --watch NAME=DIR`` (issue 39): a bundle renamed into the watched folder is swapped in by the
PUT path (verified, warmed, atomic); a half-written folder (no manifest yet) or a bundle that fails verification
is not loaded, is logged once, and what is served stays."""

import logging
import os
import shutil
import time

import pytest

from nvrm import Clip, RewardModel
from nvrm.errors import ConfigError
from nvrm.serve.models.model_watch import bundle_in, parse_watch_specs
from nvrm.serve.models.weights import manifest_sha256
from nvrm.synth.bundles import ArchSpec, build_tiny_bundle
from nvrm.synth.clips import moving_square
from helpers import InProcessServer

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
CAND = Clip(moving_square(5, 64, 32, seed=11, speed=2), fps=1)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("watch-src")
    a = build_tiny_bundle(root / "a")
    b = build_tiny_bundle(root / "b", ArchSpec(seed=7))
    bad = root / "bad"
    shutil.copytree(b, bad)
    weights = sorted(bad.glob("*.safetensors"))[0]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # the manifest's sha256 no longer matches
    weights.write_bytes(bytes(data))
    return {"a": a, "b": b, "bad": bad}


def land(src, folder, name):
    """Drop a bundle into ``folder`` as ``nvrm train`` does: written in a hidden temporary folder, renamed into place."""
    tmp = folder / f".{name}.incoming"
    shutil.copytree(src, tmp)
    os.replace(tmp, folder / name)
    return folder / name


def served_revision(server):
    return next(m["revision"] for m in server.get("/v1/models").json()["models"] if m["state"] == "serving")


def wait_for(check, seconds=60.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_watch_specs_and_the_bundle_a_folder_holds(tmp_path, bundles):
    assert parse_watch_specs(["nvrm=/out", "mine=/other"]) == [("nvrm", "/out"), ("mine", "/other")]
    for bad in (["/out"], ["=x"], ["a=/x", "a=/y"]):
        with pytest.raises(ConfigError, match="--watch"):
            parse_watch_specs(bad)
    assert bundle_in(tmp_path / "missing") is None and bundle_in(tmp_path) is None
    shutil.copytree(bundles["a"], tmp_path / ".bundle.tmp123")  # an export still being written
    assert bundle_in(tmp_path) is None
    assert bundle_in(bundles["a"]) == bundles["a"]  # DIR itself a bundle (nvrm train's OUTPUT/bundle)
    land(bundles["b"], tmp_path, "bundle")
    assert bundle_in(tmp_path) == tmp_path / "bundle"


def test_an_unknown_watched_name_is_refused(bundles, tmp_path):
    model = RewardModel.from_pretrained(bundles["a"], device="cpu")
    try:
        with pytest.raises(ConfigError, match=r"'mine' is not a served model; the models are: nvrm"):
            InProcessServer(model, watch=(f"mine={tmp_path}",))
    finally:
        model.close()


@pytest.mark.slow
def test_a_landed_bundle_is_swapped_in_and_a_broken_one_is_not(bundles, tmp_path, caplog):
    rev_a, rev_b = manifest_sha256(bundles["a"]), manifest_sha256(bundles["b"])
    with RewardModel.from_pretrained(bundles["b"], device="cpu") as reference:
        want_b = reference.score("p", CTX, CAND).reward
    watched = tmp_path / "out"
    watched.mkdir()
    own = RewardModel.from_pretrained(bundles["a"], device="cpu")  # the server's own: a swap frees it
    server = InProcessServer(own, watch=(f"nvrm={watched}",), watch_interval_s=0.1, max_wait_ms=2)
    try:
        assert server.client().score("p", CTX, CAND).model_revision == rev_a
        with caplog.at_level(logging.INFO, logger="nvrm"):
            half = watched / "half"  # weights copied, manifest not yet: never picked
            shutil.copytree(bundles["b"], half, ignore=shutil.ignore_patterns("RELEASE_MANIFEST.json", "worl-bundle.json"))
            land(bundles["bad"], watched, "bad")
            time.sleep(1.5)  # many polls
            refused = [r.getMessage() for r in caplog.records if "not loaded" in r.getMessage()]
            assert len(refused) == 1, refused  # logged once, not once per poll
            assert "verification" in refused[0] and rev_a in refused[0] and "\n" not in refused[0]
            assert served_revision(server) == rev_a
            assert server.client().score("p", CTX, CAND).model_revision == rev_a

            land(bundles["b"], watched, "good")
            assert wait_for(lambda: served_revision(server) == rev_b), "the landed bundle was not swapped in"
        r = server.client().score("p", CTX, CAND, exact=True)
        assert r.model_revision == rev_b and r.reward == want_b
        assert server.client(expect_revision=rev_b).score("p", CTX, CAND).model_revision == rev_b
    finally:
        server.stop()
