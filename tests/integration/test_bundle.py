"""Loading is strict, verified and layout-agnostic."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from nvrm import BundleError, IntegrityError, RewardModel
from nvrm.bundle import DigestCache, verify_bundle
from nvrm.synth.bundles import build_tiny_bundle, write_manifest
from nvrm.synth.clips import moving_square
from nvrm import Clip

CTX = Clip(moving_square(24, 64, 80, seed=1), fps=4)
CAND = Clip(moving_square(24, 64, 80, seed=2), fps=4)


def _copy(src, tmp_path, name="b"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _reward(path, **kw):
    return RewardModel.from_pretrained(path, device="cpu", **kw).score("p", CTX, CAND).reward


def test_prefixed_and_bare_layouts_give_identical_rewards(tmp_path, model):
    prefixed = build_tiny_bundle(tmp_path / "prefixed", key_layout="prefixed", shards=2)
    index = json.loads((prefixed / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" in index["weight_map"]
    assert all(k.startswith("model.") or k == "lm_head.weight" for k in index["weight_map"])
    assert _reward(prefixed) == model.score("p", CTX, CAND).reward


def test_list_style_manifest_and_worl_bundle_name(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    (b / "RELEASE_MANIFEST.json").unlink()
    write_manifest(b, "worl-bundle.json", style="list", revision="abc123")
    report = verify_bundle(b)
    assert report.manifest == "worl-bundle.json" and report.revision == "abc123"
    assert report.files_checked == len([p for p in b.iterdir() if p.name != "worl-bundle.json"])
    assert RewardModel.from_pretrained(b, device="cpu").revision == "abc123"


def test_tampered_shard_is_refused_by_name(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    shard = b / "model-00002-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, different bytes
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="model-00002-of-00003.safetensors sha256 does not match"):
        RewardModel.from_pretrained(b, device="cpu")
    # --no-verify skips the check (the flipped byte is in tensor data, so it still loads)
    assert isinstance(_reward(b, verify=False), float)


def test_size_mismatch_and_missing_file_reported_together(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    with open(b / "tokenizer.json", "a") as f:
        f.write(" ")
    (b / "vocab.json").unlink()
    with pytest.raises(IntegrityError) as e:
        verify_bundle(b)
    msg = str(e.value)
    assert "2 file(s)" in msg and "tokenizer.json is" in msg and "vocab.json is missing" in msg


def test_digest_cache_hits_and_invalidates_on_change(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    first = verify_bundle(b)
    second = verify_bundle(b)
    assert first.cache_hits == 0 and second.cache_hits == second.files_checked
    shard = b / "model-00001-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))  # a new mtime re-hashes
    with pytest.raises(IntegrityError, match="model-00001-of-00003"):
        verify_bundle(b)
    cache = DigestCache()
    assert any(str(shard.resolve()) in k for k in cache._data)


def test_no_manifest_loads_with_warning(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    (b / "RELEASE_MANIFEST.json").unlink()
    with pytest.warns(UserWarning, match="no RELEASE_MANIFEST.json"):
        m = RewardModel.from_pretrained(b, device="cpu")
    assert m.revision is None


def _rewrite_shard(b, fn):
    shard = b / "model-00003-of-00003.safetensors"
    state = load_file(str(shard))
    fn(state)
    save_file(state, str(shard))


def test_missing_backbone_weight_is_named(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    victim = {}

    def drop(state):
        victim["key"] = sorted(state)[0]
        del state[victim["key"]]

    _rewrite_shard(b, drop)
    with pytest.raises(BundleError, match=r"missing 1 weight\(s\): " + victim["key"].replace(".", r"\.")):
        RewardModel.from_pretrained(b, device="cpu", verify=False)


def test_wrong_shape_and_unexpected_key_are_named(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)

    def corrupt(state):
        k = sorted(state)[0]
        state[k] = torch.zeros(3, 3, dtype=torch.bfloat16)
        state["language_model.extra_adapter.weight"] = torch.zeros(2, dtype=torch.bfloat16)

    _rewrite_shard(b, corrupt)
    with pytest.raises(BundleError) as e:
        RewardModel.from_pretrained(b, device="cpu", verify=False)
    assert "wrong shape" in str(e.value) and "(3, 3)" in str(e.value)
    assert "language_model.extra_adapter.weight" in str(e.value)


@pytest.mark.parametrize(
    "head,needle",
    [
        ({}, "rm_head.weight is missing"),
        ({"rm_head.weight": torch.zeros(2, 64)}, "shape (2, 64), expected (1, 64)"),
        ({"rm_head.weight": torch.zeros(1, 64), "score.weight": torch.zeros(1)}, "unexpected key(s) score.weight"),
    ],
)
def test_bad_heads(tmp_path, tiny_bundle, head, needle):
    b = _copy(tiny_bundle, tmp_path)
    if head:
        save_file(head, str(b / "nvrm_head.safetensors"))
    else:
        (b / "nvrm_head.safetensors").unlink()
        needle = "nvrm_head.safetensors is missing"
    with pytest.raises(BundleError) as e:
        RewardModel.from_pretrained(b, device="cpu", verify=False)
    assert needle in str(e.value)


def test_head_bias_is_applied(tmp_path, tiny_bundle, model):
    b = _copy(tiny_bundle, tmp_path)
    head = load_file(str(b / "nvrm_head.safetensors"))
    head["rm_head.bias"] = torch.tensor([2.0], dtype=torch.bfloat16)
    save_file(head, str(b / "nvrm_head.safetensors"))
    base = model.score("p", CTX, CAND).reward
    biased = _reward(b, verify=False)
    assert biased == pytest.approx(base + 2.0, abs=0.02)  # bf16 rounding of the sum


def test_pickle_only_bundle_is_refused(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    for p in b.glob("model*.safetensors*"):
        p.unlink()
    (b / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(BundleError, match="pickle checkpoints are refused"):
        RewardModel.from_pretrained(b, device="cpu", verify=False)


def test_wrong_architecture_is_refused(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    cfg = json.loads((b / "config.json").read_text())
    cfg["model_type"] = "qwen2_vl"
    (b / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BundleError, match="expected model_type 'qwen3_vl'"):
        RewardModel.from_pretrained(b, device="cpu", verify=False)


def test_missing_bundle_dir_is_a_clear_error(tmp_path):
    with pytest.raises(BundleError, match="no such bundle directory"):
        RewardModel.from_pretrained(tmp_path / "nope")


def test_digest_cache_is_not_fooled_by_a_restored_mtime(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    verify_bundle(b)  # fills the digest cache (NVRM_CACHE_DIR is per test session)
    shard = sorted(b.glob("model-*.safetensors"))[0]
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # what `touch -r` does
    assert shard.stat().st_mtime_ns == st.st_mtime_ns and shard.stat().st_size == st.st_size
    with pytest.raises(IntegrityError, match=f"{shard.name} sha256 does not match"):
        verify_bundle(b)
    with pytest.raises(IntegrityError):
        RewardModel.from_pretrained(b, device="cpu")


@pytest.mark.parametrize("extra", ["chat_template.json", "chat_templates/extra.jinja", "additional_chat_templates/default.jinja",
                                   "nvrm_contract.json", "processor_config.json", "tokenizer.model"])
def test_unlisted_files_that_change_scoring_are_refused_when_verifying(tmp_path, tiny_bundle, extra):
    b = _copy(tiny_bundle, tmp_path)
    assert not (b / extra).exists()
    content = {"nvrm_contract.json": "{}", "chat_templates/extra.jinja": "{{ messages }}", "additional_chat_templates/default.jinja": "{{ messages }}",
               "tokenizer.model": "x"}.get(extra, '{"chat_template": "{{ messages }}"}')
    (b / extra).parent.mkdir(exist_ok=True)
    (b / extra).write_text(content)
    with pytest.raises(IntegrityError, match=f"{extra} is not listed"):
        verify_bundle(b)
    with pytest.raises(IntegrityError, match=extra):
        RewardModel.from_pretrained(b, device="cpu")
    RewardModel.from_pretrained(b, device="cpu", verify=False).close()  # unverified: the user's choice


def test_an_added_index_and_shard_cannot_swap_the_weights(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    state = {}
    for shard in sorted(b.glob("model-*.safetensors")):
        state.update(load_file(str(shard)))
        shard.unlink()
    save_file(state, str(b / "model.safetensors"), metadata={"format": "pt"})
    (b / "model.safetensors.index.json").unlink()
    write_manifest(b)  # a single-file bundle, verified
    RewardModel.from_pretrained(b, device="cpu").close()
    evil = {k: torch.zeros_like(v) for k, v in state.items()}
    save_file(evil, str(b / "model-evil.safetensors"), metadata={"format": "pt"})
    (b / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: "model-evil.safetensors" for k in evil}}))
    with pytest.raises(IntegrityError, match="model-evil.safetensors is not listed.*|model.safetensors.index.json is not listed"):
        RewardModel.from_pretrained(b, device="cpu")


def test_index_entries_must_stay_inside_the_bundle(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path)
    outside = tmp_path / "outside.safetensors"
    shutil.copy(sorted(b.glob("model-*.safetensors"))[0], outside)
    index = json.loads((b / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../outside.safetensors"
    (b / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(BundleError, match="lies outside the bundle"):
        RewardModel.from_pretrained(b, device="cpu", verify=False)
