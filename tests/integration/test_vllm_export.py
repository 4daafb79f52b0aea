"""``nvrm export --vllm``: vLLM's sequence-classification layout, renamed and nothing else; ``nvrm verify`` checks it
against its source; and ``dtype="float32"`` is one switch that also runs the reward head in float32."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nvrm.bundle.vllm_export import EXPORT_ARCHITECTURE, export_vllm
from nvrm.cli.main import main


@pytest.fixture(scope="module")
def export(tiny_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "vllm"
    assert main(["export", "--vllm", str(tiny_bundle), str(out)]) == 0
    return out


def _tensors(folder):
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        with safe_open(str(folder / shard), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    assert set(out) == set(weight_map)
    return out


def test_the_export_has_vllms_names_head_and_config(tiny_bundle, export):
    tensors = _tensors(export)
    src = _tensors(tiny_bundle)
    assert {k for k in tensors if not k.startswith("model.")} == {"score.weight", "score.bias"}
    assert {k[len("model."):] for k in tensors if k.startswith("model.")} == set(src)  # bare names, prefixed
    assert any(k.startswith("model.language_model.") for k in tensors) and any(k.startswith("model.visual.") for k in tensors)
    assert all(torch.equal(tensors["model." + k], v) and tensors["model." + k].dtype == v.dtype for k, v in src.items())
    with safe_open(str(tiny_bundle / "nvrm_head.safetensors"), framework="pt") as f:
        head = f.get_tensor("rm_head.weight")
    assert torch.equal(tensors["score.weight"], head) and tensors["score.weight"].shape == (1, 64)
    assert torch.equal(tensors["score.bias"], torch.zeros(1, dtype=head.dtype))  # no bias in the bundle: zero, the same reward
    cfg, raw = json.loads((export / "config.json").read_text()), json.loads((tiny_bundle / "config.json").read_text())
    assert cfg["architectures"] == [EXPORT_ARCHITECTURE] and cfg["num_labels"] == 1 and cfg["id2label"] == {"0": "reward"}
    assert {k: v for k, v in cfg.items() if k not in ("architectures", "num_labels", "id2label", "label2id", "nvrm_export")} == \
        {k: v for k, v in raw.items() if k != "architectures"}
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json",
                 "video_preprocessor_config.json"):
        assert (export / name).read_bytes() == (tiny_bundle / name).read_bytes(), name
    manifest = json.loads((export / "NVRM_EXPORT.json").read_text())
    import hashlib

    release = hashlib.sha256((tiny_bundle / "RELEASE_MANIFEST.json").read_bytes()).hexdigest()
    assert manifest["source"]["manifest_sha256"] == release == cfg["nvrm_export"]["source_manifest_sha256"]
    assert manifest["source"]["revision"] == "tiny-test-0001" == cfg["nvrm_export"]["source_revision"]


def test_verify_passes_an_export_and_names_what_was_changed(tiny_bundle, export, tmp_path, capsys):
    assert main(["verify", str(export)]) == 0
    assert "71 tensors equal" in capsys.readouterr().out
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(export, bad)
    shard = bad / "model-00001-of-00004.safetensors"
    with safe_open(str(shard), framework="pt") as f:
        part = {k: f.get_tensor(k) for k in f.keys()}
    key = sorted(part)[0]
    part[key] = part[key] + 1
    save_file(part, str(shard), metadata={"format": "pt"})
    assert main(["verify", str(bad), "--source", str(tiny_bundle)]) == 2
    assert "model-00001-of-00004.safetensors does not match NVRM_EXPORT.json" in capsys.readouterr().err
    # a consistent-looking export (manifest rewritten) whose tensor no longer equals the source's
    from nvrm.bundle import vllm_export

    recorded = json.loads((export / "NVRM_EXPORT.json").read_text())["source"]
    vllm_export._write_export_manifest(bad, "RELEASE_MANIFEST.json", recorded["manifest_sha256"], "tiny-test-0001", tiny_bundle)
    assert main(["verify", str(bad), "--source", str(tiny_bundle)]) == 2
    assert f"{key} differs from the source's" in capsys.readouterr().err


def test_export_refuses_a_non_empty_output_and_a_missing_format(tiny_bundle, export, capsys):
    assert main(["export", "--vllm", str(tiny_bundle), str(export)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert main(["export", str(tiny_bundle), str(export.parent / "other")]) == 2
    assert "--vllm" in capsys.readouterr().err


def test_export_refuses_a_tampered_source(tiny_bundle, tmp_path, capsys):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_bundle, src)
    (src / "tokenizer_config.json").write_text((src / "tokenizer_config.json").read_text() + " ")
    with pytest.raises(Exception, match="tokenizer_config.json"):
        export_vllm(src, tmp_path / "out")


def test_float32_is_one_switch_that_also_runs_the_head_in_float32(tiny_bundle, model, model32, clips):
    from nvrm import RewardModel

    with RewardModel.from_pretrained(tiny_bundle, device="cpu", dtype="float32") as m:
        assert m.head.weight.dtype == torch.float32
        assert m.contract.head_dtype == "bfloat16" and m.fingerprint == model.fingerprint  # a run setting: the preprocessing is the same
        got = m.score("a cat", clips["context"], clips["cand_a"]).reward
    assert got == model32.score("a cat", clips["context"], clips["cand_a"]).reward  # the two-setting form, one setting now
