"""The computed (not measured) 4B figures that BENCHMARKS.md puts next to the measured ones."""

from __future__ import annotations

from nvrm.bench.grad import grad_memory_4b
from nvrm.bench.harness import forward_flops
from nvrm.bench.training import format_train_step, train_cost_4b


def test_training_cost_at_the_4b_shapes():
    c = train_cost_4b(pairs=4)
    assert c["label"] == "computed"
    assert c["tokens_per_sequence"] == 37 * 70 + 125
    # a pair is two sequences; each costs about 2 * 4e9 parameters * 2.7K tokens forward, three times over for the text layers
    assert 1.2e14 < c["flop_per_pair"] < 1.8e14, c
    assert c["memory_gib_with_checkpointing"] < c["memory_gib_without_checkpointing"]
    assert 8.2 < c["memory_gib_with_checkpointing"] < 24, c  # weights plus what 4 pairs keep: fits a 24 GB card
    more = train_cost_4b(pairs=8)
    assert more["flop_per_pair"] == c["flop_per_pair"]  # per pair, whatever the step's size
    assert more["memory_gib_with_checkpointing"] > c["memory_gib_with_checkpointing"]
    assert "computed, not measured" in format_train_step({"arch": "4b", "device_name": "cpu", "batch_pairs": 4, "rows": [], "computed_4b": c})


def test_flops_count_attention_over_cached_keys():
    from types import SimpleNamespace

    text = SimpleNamespace(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4, intermediate_size=16, num_hidden_layers=1)
    vision = SimpleNamespace(hidden_size=4, spatial_merge_size=2, intermediate_size=8, out_hidden_size=8, temporal_patch_size=2, patch_size=2,
                             depth=1, deepstack_visual_indexes=())
    cfg = SimpleNamespace(text_config=text, vision_config=vision)
    assert forward_flops(cfg, [(4, 10)], []) > forward_flops(cfg, [(4, 0)], [])
    assert grad_memory_4b(G=8)["with_checkpointing_gib"] < grad_memory_4b(G=8)["without_checkpointing_gib"]
