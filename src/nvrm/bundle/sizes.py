"""A bundle's config sizes checked before anything is built: sane limits, and agreement with the weights.

A config that says ``hidden_size`` 1e9 or ``num_hidden_layers`` 1e6 would have the loader allocate
hundreds of gigabytes, or build layers for minutes, before the key-by-key check refuses it. Here every
size is first checked to be a whole positive number under a limit no real model reaches (pure), then
against the shapes the safetensors headers declare (read without loading a tensor): the vocabulary
and widths of the embedding and the first layers, and the number of text layers and vision blocks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

LIMITS = {
    "text_config": {"hidden_size": 1 << 16, "intermediate_size": 1 << 20, "num_hidden_layers": 1024, "num_attention_heads": 1024,
                    "num_key_value_heads": 1024, "head_dim": 4096, "vocab_size": 1 << 24},
    "vision_config": {"depth": 1024, "hidden_size": 1 << 16, "intermediate_size": 1 << 20, "num_heads": 1024, "out_hidden_size": 1 << 16,
                      "patch_size": 1024, "num_position_embeddings": 1 << 24, "spatial_merge_size": 64, "temporal_patch_size": 64},
}


def config_problems(raw: Mapping[str, Any]) -> list[str]:
    """Sizes of a raw ``config.json`` that are not whole positive numbers within ``LIMITS`` (pure)."""
    problems = []
    for section, limits in LIMITS.items():
        values = raw.get(section)
        if not isinstance(values, Mapping):
            problems.append(f"{section} is missing or not an object")
            continue
        for name, most in limits.items():
            if name not in values or values[name] is None:
                continue
            v = values[name]
            if isinstance(v, bool) or not isinstance(v, int):
                problems.append(f"{section}.{name}={v!r} is not a whole number")
            elif not 1 <= v <= most:
                problems.append(f"{section}.{name}={v} is outside 1..{most}")
    return problems


def header_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape as the safetensors headers declare it (no tensor is read), by canonical key.

    A file that is not a readable safetensors file raises ``HeaderError`` (a ``ValueError``) naming it."""
    from .safetensors_header import read_header

    shapes = {}
    for file in files:
        for key, tensor in read_header(file).items():
            name = key[len("model."):] if key.startswith("model.") else key
            shapes[name] = tensor.shape
    return shapes


def _count(shapes: Mapping[str, tuple[int, ...]], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    return len({m.group(1) for k in shapes if (m := pattern.match(k))})


def shape_problems(raw: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Where the config's sizes disagree with the weights' declared shapes (pure; a missing tensor is the loader's to report)."""
    t, v = raw.get("text_config") or {}, raw.get("vision_config") or {}
    hidden, heads = t.get("hidden_size"), t.get("num_attention_heads")
    head_dim = t.get("head_dim") or (hidden // heads if hidden and heads else None)
    expected = {
        "language_model.embed_tokens.weight": (t.get("vocab_size"), hidden),
        "language_model.layers.0.mlp.gate_proj.weight": (t.get("intermediate_size"), hidden),
        "language_model.layers.0.self_attn.q_proj.weight": (heads * head_dim if heads and head_dim else None, hidden),
        "language_model.layers.0.self_attn.k_proj.weight": (t["num_key_value_heads"] * head_dim if t.get("num_key_value_heads") and head_dim else None, hidden),
        "visual.blocks.0.attn.qkv.weight": (3 * v["hidden_size"] if v.get("hidden_size") else None, v.get("hidden_size")),
        "visual.blocks.0.mlp.linear_fc1.weight": (v.get("intermediate_size"), v.get("hidden_size")),
        "visual.pos_embed.weight": (v.get("num_position_embeddings"), v.get("hidden_size")),
    }
    problems = []
    for key, want in expected.items():
        got = shapes.get(key)
        if got is not None and None not in want and tuple(got) != tuple(want):
            problems.append(f"{key} is {list(got)} in the weights, the config implies {list(want)}")
    for prefix, name, value in (("language_model.layers.", "text_config.num_hidden_layers", t.get("num_hidden_layers")),
                                ("visual.blocks.", "vision_config.depth", v.get("depth"))):
        found = _count(shapes, prefix)
        if found and value != found:
            problems.append(f"{name}={value} but the weights hold {found}")
    return problems
