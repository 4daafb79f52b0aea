"""Bundles are written in transformers 4.x's file layout whatever transformers is installed.

- On 4.57.6, nvrm's writer (``nvrm.bundle.assets``) gives the same bytes as 4.57.6's own
  ``save_pretrained`` of the same tokenizer, processor and config.
- Under transformers 5.25 (an overlay on this torch, ``tests/overlays.py``), a bundle built there is byte
  for byte the bundle built here, and loads, verifies and scores here under 4.57.6.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest

from overlays import ROOT, env_with, overlay

pytestmark = pytest.mark.versions


def _save_like_transformers_4(tmp: Path) -> Path:
    """The tiny bundle's assets as transformers 4.57.6's save_pretrained writes them."""
    import torch
    from transformers import Qwen2TokenizerFast, Qwen2VLImageProcessorFast, Qwen3VLConfig, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    from nvrm.synth.bundles import CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, ArchSpec, build_tokenizer

    spec = ArchSpec()
    tok = Qwen2TokenizerFast(tokenizer_object=build_tokenizer(spec.vocab_target), unk_token=None, bos_token=None, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tok.model_max_length = 262144
    common = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessorFast(**common, size={"shortest_edge": 65536, "longest_edge": 16777216}),
        tokenizer=tok,
        video_processor=Qwen3VLVideoProcessor(**common, size={"shortest_edge": 4096, "longest_edge": 25165824}),
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(str(tmp))
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
                         num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, max_position_embeddings=262144,
                         rope_theta=spec.rope_theta,
                         rope_scaling={"rope_type": "default", "mrope_section": list(spec.mrope_section), "mrope_interleaved": True},
                         tie_word_embeddings=True, bos_token_id=ids[PAD_TOKEN], eos_token_id=ids[EOS_TOKEN], pad_token_id=ids[PAD_TOKEN]),
        vision_config=dict(depth=spec.vision_depth, hidden_size=spec.vision_hidden, intermediate_size=spec.vision_intermediate, num_heads=spec.vision_heads,
                           out_hidden_size=spec.hidden_size, patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                           num_position_embeddings=spec.num_position_embeddings, deepstack_visual_indexes=list(spec.deepstack_indexes)),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True,
    )
    config.architectures = ["Qwen3VLModel"]
    config.dtype = torch.bfloat16
    config.save_pretrained(str(tmp))
    return tmp


def test_the_writer_gives_what_transformers_4_57_saves(tmp_path):
    import transformers

    from nvrm.synth.bundles import build_tiny_bundle

    assert transformers.__version__ == "4.57.6"
    theirs = _save_like_transformers_4(tmp_path / "saved")
    ours = build_tiny_bundle(tmp_path / "ours", manifest=None)
    names = sorted(p.name for p in theirs.iterdir())
    assert "vocab.json" in names and "preprocessor_config.json" in names and "config.json" in names
    _, mismatch, errors = filecmp.cmpfiles(theirs, ours, names, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)


def test_a_bundle_written_under_transformers_5_loads_and_verifies_under_4_57(tmp_path, tiny_bundle, model, clips):
    from nvrm import RewardModel
    from nvrm.bundle import verify_bundle

    target = overlay(["transformers==5.25.0"], "transformers-5.25.0")
    out = tmp_path / "written-by-5.25"
    code = "import sys, transformers; from nvrm.synth.bundles import build_tiny_bundle; build_tiny_bundle(sys.argv[1]); print(transformers.__version__)"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], env=env_with(target), capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "5.25.0", proc.stderr[-3000:]
    names = sorted(p.name for p in tiny_bundle.iterdir())
    _, mismatch, errors = filecmp.cmpfiles(tiny_bundle, out, names, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    verify_bundle(out)
    with RewardModel.from_pretrained(out, device="cpu") as written:
        assert written.score("p", clips["context"], clips["cand_a"]).reward == model.score("p", clips["context"], clips["cand_a"]).reward
