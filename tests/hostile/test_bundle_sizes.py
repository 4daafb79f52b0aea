"""Absurd configs are refused before anything is built, by loading and by ``nvrm verify`` (issue 33, items 8
and 19): sizes outside sane limits or not whole positive numbers, and sizes the weights do not have."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from nvrm.bundle import write_manifest
from nvrm.cli.main import main
from nvrm.errors import BundleError


def edited(tiny_bundle, tmp_path, section, **values):
    b = tmp_path / "edited"
    shutil.copytree(tiny_bundle, b)
    config = json.loads((b / "config.json").read_text())
    config[section].update(values)
    (b / "config.json").write_text(json.dumps(config))
    write_manifest(b, revision="edited-0001")  # a matching manifest: verify's digests pass
    return b


@pytest.mark.parametrize("section,values,message", [
    ("text_config", {"hidden_size": 10**9}, "text_config.hidden_size=1000000000 is outside 1..65536"),
    ("text_config", {"num_hidden_layers": 10**6}, "text_config.num_hidden_layers=1000000 is outside 1..1024"),
    ("text_config", {"hidden_size": -64}, "text_config.hidden_size=-64 is outside 1..65536"),
    ("text_config", {"hidden_size": 64.5}, "text_config.hidden_size=64.5 is not a whole number"),
    ("vision_config", {"depth": True}, "vision_config.depth=True is not a whole number"),
    ("text_config", {"hidden_size": 128}, "language_model.embed_tokens.weight is [499, 64] in the weights, the config implies [499, 128]"),
    ("text_config", {"num_hidden_layers": 3}, "text_config.num_hidden_layers=3 but the weights hold 2"),
    ("vision_config", {"depth": 64}, "vision_config.depth=64 but the weights hold 2"),
])
def test_absurd_or_mismatched_sizes_are_refused_before_building(tiny_bundle, tmp_path, capsys, section, values, message):
    from nvrm import RewardModel

    b = edited(tiny_bundle, tmp_path, section, **values)
    t0 = time.monotonic()
    with pytest.raises(BundleError) as e:
        RewardModel.from_pretrained(b)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - t0 < 30  # refused, not built
    capsys.readouterr()
    assert main(["verify", str(b)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("nvrm")]
    assert len(err) == 1 and message in err[0] and "internal error" not in err[0]
