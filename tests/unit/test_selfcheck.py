"""The load-time transformers self-check (``nvrm.engine.selfcheck``): the bundle's tokenizer and image processor give the
release profile's token ids and pixel values on a fixed fixture, or loading fails in one line naming the transformers.

The versions tier (``tests/versions/test_transformers_matrix.py``) runs this file under every transformers of the matrix,
so there the recorded fingerprints (transformers 4.57.6's) are held against each version. Record them again, on purpose
and only under 4.57.6: ``NVRM_UPDATE_SELFCHECK=1 .venv/bin/python -m pytest tests/unit/test_selfcheck.py``.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
from pathlib import Path

import pytest
import transformers

from nvrm.bundle import load_processor
from nvrm.cli.demo import demo_bundle_path
from nvrm.engine import selfcheck as S
from nvrm.errors import ConfigError
from nvrm.synth.bundles import RELEASE_ASSETS

from helpers import release_files


def release_processor_files(folder: Path) -> Path:
    """Qwen3-VL-4B-Instruct's processor, tokenizer and template files (the release's base), without weights."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*RELEASE_ASSETS, "config.json"):
        plain, packed = release_files() / name, release_files() / f"{name}.gz"
        if plain.is_file():
            (folder / name).write_bytes(plain.read_bytes())
        elif packed.is_file():
            (folder / name).write_bytes(gzip.decompress(packed.read_bytes()))
    return folder


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    return {
        "nvrm's synthetic bundles (the demo bundle, tiny, mid, deep)": demo_bundle_path(),
        "Qwen3-VL-4B-Instruct's processor and tokenizer files (the release-shaped bundles)": release_processor_files(tmp_path_factory.mktemp("release")),
    }


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(S, "_PASSED", set())
    monkeypatch.delenv("NVRM_SKIP_SELFCHECK", raising=False)


def test_the_recorded_fingerprints_are_what_this_transformers_gives(bundles):
    got = {S.bundle_key(path): {"name": name, **S.measure(load_processor(path))} for name, path in bundles.items()}
    if os.environ.get("NVRM_UPDATE_SELFCHECK"):
        assert transformers.__version__ == S.RELEASE_PROFILE, "record the self-check only under the release profile"
        S.TABLE.write_text(json.dumps({"transformers": S.RELEASE_PROFILE, "bundles": got}, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    assert json.loads(S.TABLE.read_text())["transformers"] == S.RELEASE_PROFILE
    assert S.recorded() == got, f"transformers {transformers.__version__} tokenizes or encodes the fixture unlike {S.RELEASE_PROFILE}"


def test_the_fixture_is_fixed_and_small():
    a, b = S.frame(), S.frame()
    assert a.shape == (64, 64, 3) and a.dtype.name == "uint8" and (a == b).all() and len(set(a.ravel().tolist())) > 200
    assert any(ord(ch) > 0xFFFF for ch in S.PROMPT) and "\t" in S.PROMPT and "  " in S.PROMPT


def changed_tokenizer(processor):
    p = copy.deepcopy(processor)
    p.tokenizer.add_tokens(["naïve café"])  # what a tokenizer that merges differently does to the ids
    return p


def changed_pixels(processor):
    p = copy.deepcopy(processor)
    p.image_processor.image_mean = [0.25, 0.5, 0.5]  # what a processor that normalises differently does to the pixels
    return p


@pytest.mark.parametrize("change, what", [(changed_tokenizer, "token ids"), (changed_pixels, "pixel values")], ids=["tokenizer", "pixels"])
def test_a_change_is_one_line_naming_the_transformers_version(change, what, fresh):
    path = demo_bundle_path()
    with pytest.raises(ConfigError) as e:
        S.check(change(load_processor(path)), S.bundle_key(path))
    msg = str(e.value)
    assert "\n" not in msg and f"transformers {transformers.__version__} changes the {what}" in msg, msg
    assert "NVRM_SKIP_SELFCHECK" in msg and S.RELEASE_PROFILE in msg


def test_a_bundle_the_table_does_not_hold_is_not_checked(fresh):
    S.check(changed_tokenizer(load_processor(demo_bundle_path())), "0" * 64)


def test_loading_runs_it_once_per_bundle_and_the_engine_loads_checked(fresh, monkeypatch):
    from nvrm.engine import Engine

    calls = []
    real = S.measure
    monkeypatch.setattr(S, "measure", lambda p: calls.append(1) or real(p))
    S.load_checked_processor(demo_bundle_path())
    S.load_checked_processor(demo_bundle_path())
    assert len(calls) == 1  # a second load of the same files costs nothing
    monkeypatch.setattr(S, "_PASSED", set())
    monkeypatch.setattr(S, "measure", lambda p: {"ids": "0" * 64, "pixels": real(p)["pixels"]})
    with pytest.raises(ConfigError, match=f"transformers {transformers.__version__} changes the token ids"):
        Engine.for_bundle(demo_bundle_path())
    monkeypatch.setenv("NVRM_SKIP_SELFCHECK", "1")
    Engine.for_bundle(demo_bundle_path()).close()
