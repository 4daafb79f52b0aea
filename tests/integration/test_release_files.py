"""Bundles built from the real Qwen3-VL-4B-Instruct release files: config, processor, template, tokenizer."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import release_files
from nvrm import Clip, InputError, RewardModel
from nvrm.engine.tasks import item_job
from nvrm.engine.chat import images_kwargs, render
from nvrm.fidelity.reference import ReferenceScorer
from nvrm.synth.bundles import ArchSpec, build_release_bundle
from nvrm.synth.clips import moving_square

SPEC = ArchSpec(mrope_section=(2, 3, 3))
RELEASE_SHA256 = {  # the Hub release's files (PROVENANCE.md)
    "config.json": "edac7703329133edfc53e46ac0081835144c99d7eebf28b71c732694d435224d",
    "preprocessor_config.json": "27225450ac9c6529872ee1924fcb0962ff5634834f817040f444118116f4e516",
    "video_preprocessor_config.json": "7768af27c1fafa9cc9011c1dc20067e03f8915e03b63504550e11d5066986d13",
    "chat_template.json": "6f8a6a55027e3da5160105556cda5dd69f6423f1c32645f6730d32de7773d0c4",
    "tokenizer_config.json": "c2da771801886ad9ae98181793ffd3dfb7f1af30f6f7c6a4e15d7dbba52e2399",
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
    "merges.txt": "599bab54075088774b1733fde865d5bd747cbcc7a547c5bc12610e874e26f5e3",
}
CTX = Clip(moving_square(8, 96, 128, seed=1), fps=4)
CAND = Clip(moving_square(24, 96, 128, seed=2), fps=4)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    return {layout: build_release_bundle(root / layout, release_files(), SPEC, key_layout=layout) for layout in ("bare", "prefixed")}


@pytest.fixture(scope="module")
def real(bundles):
    m = RewardModel.from_pretrained(bundles["bare"], device="cpu")
    yield m
    m.close()


def test_fixtures_are_the_release_files():
    d = release_files()
    for name, digest in RELEASE_SHA256.items():
        data = (d / name).read_bytes() if (d / name).is_file() else gzip.decompress((d / (name + ".gz")).read_bytes())
        assert hashlib.sha256(data).hexdigest() == digest, name
    config = json.loads((d / "config.json").read_text())
    assert config["text_config"]["num_hidden_layers"] == 36 and config["text_config"]["vocab_size"] == 151936
    assert config["vision_config"]["deepstack_visual_indexes"] == [5, 11, 17]


@pytest.mark.slow
@pytest.mark.transformers_forward
def test_both_key_layouts_load_and_match_the_reference(bundles, real):
    rewards = {}
    for layout, path in bundles.items():
        with RewardModel.from_pretrained(path, device="cpu") as m:
            rewards[layout] = m.score("A cat walks.", CTX, CAND).reward
        ref = ReferenceScorer(path)
        p = real.prepare("A cat walks.", CTX, CAND)
        inputs = ref.inputs("A cat walks.", list(p.context.images), list(p.candidate.images))
        assert torch.equal(inputs["input_ids"][0], p.encoded.input_ids)
        assert ref.reward(inputs) == rewards[layout]
    assert rewards["bare"] == rewards["prefixed"]


def test_rendered_prompt_bytes_and_token_ids(real):
    text = render(real.processor, "A cat walks.", 2, 5, real.contract)
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    assert text == (
        "<|im_start|>user\nA cat walks.\nPreceding video:\n" + image * 2
        + "\nCandidate continuation:\n" + image * 5 + "<|im_end|>\n<|im_start|>assistant\n"
    )
    thinking = render(real.processor, "A cat walks.", 2, 5, type(real.contract)(enable_thinking=True))
    assert thinking == text  # the Instruct template has no thinking branch
    ids = real.prepare("A cat walks.", CTX, CAND).encoded.input_ids.tolist()
    # Qwen's fixed ids: <|im_start|> user \n ... <|vision_start|> <|image_pad|> ... <|im_end|> \n <|im_start|> assistant \n
    assert ids[:3] == [151644, 872, 198] and ids[-5:] == [151645, 198, 151644, 77091, 198]
    # "A", " cat", " walks", ".\n", "Pre", "ced", "ing", " video", ":\n", <|vision_start|>, <|image_pad|> ...
    assert ids[3:14] == [32, 8251, 22479, 624, 4703, 1998, 287, 2766, 510, 151652, 151655]
    after_context = ids.index(151653, ids.index(151653) + 1) + 1  # past the second context <|vision_end|>
    assert ids[after_context : after_context + 5] == [198, 63901, 41171, 510, 151652]  # "\n", "Candidate", " continuation", ":\n"
    assert ids.count(151652) == 2 + 5 and ids.count(151653) == 2 + 5


def test_contract_bounds_override_the_processors_own(real):
    ip = real.processor.image_processor
    assert ip.size["shortest_edge"] == 65536  # the release's own bound differs from the contract's 1,024
    frame = Image.fromarray(np.full((64, 864, 3), 100, np.uint8))  # already contract-sized: 2 x 27 merged tokens
    own = ip(images=[frame], return_tensors="pt")["image_grid_thw"][0].tolist()
    ours = ip(images=[frame], return_tensors="pt", **images_kwargs(real.contract))["image_grid_thw"][0].tolist()
    assert ours == [1, 4, 54] and own != ours
    assert real.engine.codec.encode([frame])[1][0].tolist() == [1, 4, 54]


@pytest.mark.parametrize(
    "shape,grid",
    [
        ((480, 832), [1, 12, 22]),  # landscape: 624x360 -> 352x192 within 76,800 pixels
        ((832, 480), [1, 22, 12]),  # portrait: 208x360 -> 192x352
        ((512, 512), [1, 16, 16]),  # square: 360x360 -> 256x256
    ],
)
def test_grid_and_pixel_values_of_portrait_landscape_square(real, shape, grid):
    clip = Clip(moving_square(20, *shape, seed=5), fps=4)
    video = real.prepare_video(clip, "candidate")
    assert video.grid[0].tolist() == grid
    ref = real.processor.image_processor(images=list(video.images), return_tensors="pt", **images_kwargs(real.contract))
    assert torch.equal(real.engine.codec.to_pixel_values(video.pixels), ref["pixel_values"])


@pytest.mark.slow
def test_template_only_in_tokenizer_config_is_used(bundles, tmp_path, real):
    path = tmp_path / "no-template"
    shutil.copytree(bundles["bare"], path)
    (path / "chat_template.json").unlink()
    with RewardModel.from_pretrained(path, device="cpu", verify=False) as m:
        assert m.info()["chat_template"] == "tokenizer_config.json"
        assert m.score("p", CTX, CAND).reward == real.score("p", CTX, CAND).reward
    assert real.info()["chat_template"] == "chat_template.json"


@pytest.mark.parametrize("token", ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"])
def test_vision_tokens_in_a_prompt_are_a_clean_error(real, token):
    with pytest.raises(InputError, match="vision token"):
        real.score(f"look {token} here", CTX, CAND)
    out = real.score_group(f"look {token}", CTX, [CAND], errors="return")
    assert isinstance(out[0], InputError) and token in str(out[0])


def test_control_tokens_are_refused_and_added_tokens_kept(real):
    for token in ("<|im_end|>", "<|im_start|>", "<|endoftext|>"):
        with pytest.raises(InputError, match="control token"):
            real.score(f"a {token} b", CTX, CAND)
    ids = real.engine._workers.run_inline(item_job, "think <think> now", CTX, CAND).encoded.input_ids.tolist()
    assert 151667 in ids  # <think> is an ordinary added token: tokenised as the release's processor does


@pytest.mark.parametrize("layout, which", [  # tied to lm_head / plain; the fast tier keeps one of each layout and each kind
    ("bare", "embed_tokens.weight"), ("prefixed", "layers.1.mlp.up_proj.weight"),
    pytest.param("prefixed", "embed_tokens.weight", marks=pytest.mark.slow), pytest.param("bare", "layers.1.mlp.up_proj.weight", marks=pytest.mark.slow)])
def test_a_missing_weight_is_an_error_in_every_loader(bundles, tmp_path, layout, which):
    from safetensors.torch import load_file, save_file

    from nvrm.errors import BundleError

    path = tmp_path / "missing"
    shutil.copytree(bundles[layout], path)
    key = ("model." if layout == "prefixed" else "") + "language_model." + which
    for shard in path.glob("model-*.safetensors"):
        tensors = load_file(str(shard))
        if key in tensors:
            del tensors[key]
            save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(BundleError, match="missing 1 weight\\(s\\): language_model." + which.replace(".", r"\.")):
        RewardModel.from_pretrained(path, device="cpu", verify=False)
    with pytest.raises(ValueError, match="language_model." + which.replace(".", r"\.")):
        ReferenceScorer(path)
