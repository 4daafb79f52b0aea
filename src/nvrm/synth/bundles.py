"""Build small random-weight bundles in the exact WORL-NVRM release layout.

The real release is ~9 GB and cannot be fetched here, so tests, the demo and
the CPU benchmark build their own: ``config.json`` (``Qwen3VLModel``), three
backbone shards with ``model.safetensors.index.json``, ``nvrm_head.safetensors``
(``rm_head.weight``), processor and tokenizer assets with a chat template, and
an integrity manifest. The runtime loads them through the same code path as
the release; nothing in it knows these are test bundles.

Weights are seeded per parameter name, so a bundle is a pure function of its
spec and seed.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch

from ..bundle import sha256_file, write_backbone, write_manifest  # noqa: F401 (re-exported for tests)
from ..bundle.assets import qwen3_vl_config, write_config, write_processor, write_tokenizer
from ..bundle.load import read_config

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# A Qwen3-VL style chat template written for nvrm's test bundles: no default
# system prompt, images as <|vision_start|><|image_pad|><|vision_end|>, text
# verbatim, generation prompt "<|im_start|>assistant\n". Whitespace is emitted
# only through string literals so Jinja's trim settings cannot change it.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or 'image' in item -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'video' or 'video' in item -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

_CORPUS = (
    "A person walks down a busy street at night. The camera moves forward through a forest. "
    "A red car drives along the coast road. Preceding video: Candidate continuation: "
    "the scene continues smoothly, objects keep moving, light changes, a cat jumps onto a table. "
    "Ein Hund läuft über die Wiese. 街道上的行人 カメラが前進する 0123456789 ,.;:!?-()[]{}"
)


@dataclass(frozen=True)
class ArchSpec:
    """Architecture of a test bundle (Qwen3-VL shaped, tiny sizes)."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    mrope_section: tuple[int, int, int] = (2, 3, 3)
    rope_theta: float = 5000000.0
    """The release's value; tiny head dims resolve positions better with a small one."""
    vision_depth: int = 2
    vision_hidden: int = 32
    vision_heads: int = 2
    vision_intermediate: int = 64
    deepstack_indexes: tuple[int, ...] = (0, 1)
    num_position_embeddings: int = 64
    vocab_target: int = 512
    weight_std: float = 0.08
    seed: int = 0
    extra_text: dict = field(default_factory=dict)

    @classmethod
    def from_name(cls, name: str, **changes) -> "ArchSpec":
        """A named architecture (``ARCHITECTURES``: tiny, deep, mid, 4b), with any fields changed (e.g. ``seed=7``)."""
        import dataclasses

        if name not in ARCHITECTURES:
            from ..errors import ConfigError

            raise ConfigError(f"architecture {name!r}: must be one of {', '.join(ARCHITECTURES)}")
        return dataclasses.replace(ARCHITECTURES[name], **changes)


MID_SPEC = ArchSpec(
    hidden_size=256,
    num_layers=4,
    num_heads=8,
    num_kv_heads=4,
    head_dim=32,
    intermediate_size=768,
    mrope_section=(4, 6, 6),
    vision_depth=4,
    vision_hidden=128,
    vision_heads=4,
    vision_intermediate=512,
    deepstack_indexes=(1, 2, 3),
    num_position_embeddings=256,
    weight_std=0.05,
)
"""A mid-size random bundle for CPU benchmarks (a few tens of MB)."""

QWEN3_VL_4B_SPEC = ArchSpec(
    hidden_size=2560,
    num_layers=36,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=9728,
    mrope_section=(24, 20, 20),
    vision_depth=24,
    vision_hidden=1024,
    vision_heads=16,
    vision_intermediate=4096,
    deepstack_indexes=(5, 11, 17),
    num_position_embeddings=2304,
    weight_std=0.02,
)
"""The Qwen3-VL-4B architecture (random weights; tiny vocabulary) for GPU benchmarks."""

ARCHITECTURES: dict[str, ArchSpec] = {
    "tiny": ArchSpec(),
    "deep": ArchSpec(num_layers=36),
    "mid": MID_SPEC,
    "4b": QWEN3_VL_4B_SPEC,
    "tiny32": ArchSpec(head_dim=32, mrope_section=(4, 6, 6), vision_hidden=64, vision_intermediate=128),
}
"""The one registry of named architectures (tests, benchmarks, scripts): ``ArchSpec.from_name``.

- ``tiny``: 2 text layers, hidden 64 (unit and integration tests);
- ``deep``: the tiny widths at the release's depth, 36 text layers (drift at depth);
- ``mid``: a few tens of MB (CPU benchmarks);
- ``tiny32``: the tiny widths with head dims of 32 in text and vision (vLLM's CPU attention has no 16);
- ``4b``: the Qwen3-VL-4B shapes (GPU benchmarks)."""



def build_tokenizer(vocab_target: int = 512):
    """A small byte-level BPE ``tokenizers.Tokenizer`` with Qwen's special tokens (eos, pad, then the rest:
    the ids ``Qwen2TokenizerFast`` gives them)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_target - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    order = [EOS_TOKEN, PAD_TOKEN] + [t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in order])
    return tok


def write_assets(bundle: Path, tokenizer, chat_template: str = CHAT_TEMPLATE) -> None:
    """Tokenizer and processor files shaped like the release's (4.x layout, on every transformers); note
    the image processor's own pixel bounds (shortest_edge 65,536) differ from the contract's."""
    write_tokenizer(bundle, tokenizer, SPECIAL_TOKENS, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    write_processor(bundle, chat_template)


def build_config(spec: ArchSpec, tokenizer) -> dict:
    """``config.json`` (4.x layout) of a bundle of architecture ``spec`` over ``tokenizer``."""
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    text = dict(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        rope_theta=spec.rope_theta,
        rope_scaling={"rope_type": "default", "mrope_section": list(spec.mrope_section), "mrope_interleaved": True},
        bos_token_id=ids[PAD_TOKEN],
        eos_token_id=ids[EOS_TOKEN],
        pad_token_id=ids[PAD_TOKEN],
        **spec.extra_text,
    )
    vision = dict(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden,
        intermediate_size=spec.vision_intermediate,
        num_heads=spec.vision_heads,
        out_hidden_size=spec.hidden_size,
        num_position_embeddings=spec.num_position_embeddings,
        deepstack_visual_indexes=list(spec.deepstack_indexes),
    )
    token_ids = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    return qwen3_vl_config(text, vision, token_ids)


def _seeded_normal(name: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g) * std


def random_state_dict(config, spec: ArchSpec) -> dict[str, torch.Tensor]:
    """Backbone weights in the bare ``Qwen3VLModel`` key layout, bfloat16."""
    from accelerate import init_empty_weights

    from ..forward.compat import build_backbone

    with init_empty_weights():
        shapes = {k: tuple(v.shape) for k, v in build_backbone(config, "sdpa", torch.bfloat16).state_dict().items()}
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if len(shape) == 1 and ("norm" in name):
            t = 1.0 + _seeded_normal(name, shape, spec.seed, 0.1)
        elif name.endswith("bias"):
            t = _seeded_normal(name, shape, spec.seed, 0.02)
        elif "embed_tokens" in name:
            t = _seeded_normal(name, shape, spec.seed, 1.0)
        else:
            t = _seeded_normal(name, shape, spec.seed, spec.weight_std)
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def _write_weights(
    bundle: Path, config, spec: ArchSpec, key_layout: str, shards: int, head_bias: bool
) -> None:
    """Random backbone (bare or ``model.``-prefixed keys) and reward head, in the release files."""
    from safetensors.torch import save_file

    hidden = config.text_config.hidden_size
    state = random_state_dict(config, spec)
    if key_layout == "prefixed":  # as saved from Qwen3VLForConditionalGeneration
        state = {f"model.{k}": v for k, v in state.items()}
        state["lm_head.weight"] = _seeded_normal("lm_head.weight", (config.text_config.vocab_size, hidden), spec.seed, 0.02).to(torch.bfloat16)
    write_backbone(bundle, state, shards)
    head = {"rm_head.weight": _seeded_normal("rm_head.weight", (1, hidden), spec.seed, 1.0 / hidden**0.5)}
    if head_bias:
        head["rm_head.bias"] = _seeded_normal("rm_head.bias", (1,), spec.seed, 0.5)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in head.items()}, str(bundle / "nvrm_head.safetensors"))


def build_tiny_bundle(
    out_dir: str | Path,
    spec: ArchSpec = ArchSpec(),
    *,
    key_layout: Literal["bare", "prefixed"] = "bare",
    shards: int = 3,
    head_bias: bool = False,
    manifest: str | None = "RELEASE_MANIFEST.json",
    manifest_style: Literal["dict", "list"] = "dict",
    revision: str | None = "tiny-test-0001",
    contract_overrides: dict | None = None,
    label: str = "nvrm tiny random-weight test bundle (NOT the WORL-NVRM release weights)",
) -> Path:
    """Write a random-weight bundle in the release layout and return its path."""
    bundle = Path(out_dir)
    bundle.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_target)
    write_assets(bundle, tokenizer)
    write_config(bundle, build_config(spec, tokenizer))
    _write_weights(bundle, read_config(bundle), spec, key_layout, shards, head_bias)
    if contract_overrides:
        (bundle / "nvrm_contract.json").write_text(json.dumps(contract_overrides, indent=2, sort_keys=True) + "\n")
    (bundle / "README.md").write_text(f"# {label}\n\nspec: {json.dumps(asdict(spec), sort_keys=True)}\n")
    if manifest:
        write_manifest(bundle, manifest, manifest_style, revision)
    return bundle


RELEASE_ASSETS = (
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "chat_template.json",
    "tokenizer_config.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
)
"""Processor and tokenizer files of a Qwen3-VL release, copied unchanged by ``build_release_bundle``."""


def shrink_config(raw: dict, spec: ArchSpec) -> dict:
    """A release ``config.json`` with only its layer counts and widths replaced by ``spec``'s (pure).

    Vocabulary, special-token ids, RoPE settings and everything else stay as released.
    """
    out = json.loads(json.dumps(raw))
    text, vision = out["text_config"], out["vision_config"]
    text.update(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
    )
    text["rope_scaling"] = {**text.get("rope_scaling", {}), "mrope_section": list(spec.mrope_section)}
    vision.update(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden,
        intermediate_size=spec.vision_intermediate,
        num_heads=spec.vision_heads,
        out_hidden_size=spec.hidden_size,
        deepstack_visual_indexes=list(spec.deepstack_indexes),
    )
    return out


def build_release_bundle(
    out_dir: str | Path,
    release_files: str | Path,
    spec: ArchSpec = ArchSpec(),
    *,
    key_layout: Literal["bare", "prefixed"] = "bare",
    shards: int = 2,
    manifest: str | None = "RELEASE_MANIFEST.json",
    revision: str | None = "release-shaped-0001",
) -> Path:
    """A random-weight bundle from a Qwen3-VL release's own files: real processor, tokenizer and
    template files unchanged (``.gz`` files decompressed), ``config.json`` shrunk by ``spec``."""
    import gzip

    src, bundle = Path(release_files), Path(out_dir)
    bundle.mkdir(parents=True, exist_ok=True)
    for name in RELEASE_ASSETS:
        plain, packed = src / name, src / (name + ".gz")
        if plain.is_file():
            (bundle / name).write_bytes(plain.read_bytes())
        elif packed.is_file():
            (bundle / name).write_bytes(gzip.decompress(packed.read_bytes()))
    raw = json.loads((src / "config.json").read_text())
    (bundle / "config.json").write_text(json.dumps(shrink_config(raw, spec), indent=2, sort_keys=True) + "\n")
    _write_weights(bundle, read_config(bundle), spec, key_layout, shards, head_bias=False)
    (bundle / "README.md").write_text(
        "# nvrm release-shaped random-weight test bundle (NOT the WORL-NVRM release weights)\n\n"
        f"processor, tokenizer and template files from {src.name}; config shrunk to {json.dumps(asdict(spec), sort_keys=True)}\n"
    )
    if manifest:
        write_manifest(bundle, manifest, "dict", revision)
    return bundle
