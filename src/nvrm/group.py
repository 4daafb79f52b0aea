"""Shared-context group scoring: one prefix, G candidate suffixes.

In GRPO-style RL every step scores G candidates that share the prompt and the
preceding context. The sequence of item g is ``prefix + suffix_g`` where the
prefix (chat header, prompt, context frames, "Candidate continuation:" text)
is identical for all g. So:

1. the context frames go through the vision tower once, and the language
   model runs over the prefix once, keeping its KV cache (``prefill``);
2. the suffixes (candidate frames + closing tokens) run in batches against
   that cache, expanded per row, with the 3-D positions and deepstack
   features each full sequence would have had (``score_suffixes``). A batch
   holds suffixes of one length only, so no row carries padding.

The result equals scoring each item alone (same tokens, same positions, same
visual features); only floating-point reduction order differs (README,
"Fidelity").

Shapes: G candidates, P prefix tokens, S suffix tokens, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import DynamicCache

from .batching import plan_batches
from .engine.encode import GroupEncoded
from .model import RewardHead, embed, image_features, to_device


@dataclass
class Prefix:
    """The prefix's KV cache on the device, reusable across chunks of one group."""

    ids: torch.Tensor  # [P] token ids (CPU), to check a later chunk shares it
    positions: torch.Tensor  # [3, P]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: [1, kv_heads, P, d]

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])

    def matches(self, enc: GroupEncoded) -> bool:
        return enc.prefix_len == self.length and torch.equal(enc.ids[0][: self.length], self.ids) and torch.equal(
            enc.positions[0][:, : self.length], self.positions
        )


@torch.inference_mode()
def prefill(backbone, enc: GroupEncoded, *, device: torch.device, vision=None) -> Prefix:
    """Vision tower on the context and one language-model pass over the prefix."""
    lm = backbone.language_model
    P = enc.prefix_len
    ids = enc.ids[0][:P]
    positions = enc.positions[0][:, :P]
    embeds, mask, deepstack = embed(
        backbone, vision, to_device(ids.unsqueeze(0), device), to_device(enc.context_pixels, device), enc.context_grid, enc.codec
    )
    cache = DynamicCache(config=lm.config)
    lm(
        inputs_embeds=embeds,
        attention_mask=torch.ones((1, P), dtype=torch.long, device=device),
        position_ids=to_device(positions.unsqueeze(1), device),
        past_key_values=cache,
        use_cache=True,
        visual_pos_masks=mask,
        deepstack_visual_embeds=deepstack,
    )
    return Prefix(ids, positions, [(layer.keys, layer.values) for layer in cache.layers])


def plan_suffix_batches(suffix_lens: Sequence[int], prefix_len: int, max_batch_tokens: int) -> list[list[int]]:
    """Rows grouped by equal suffix length, each batch within the key-position budget (pure).

    A row attends to ``prefix_len + S`` key positions; a batch holds at most
    ``max_batch_tokens`` of them (one row always runs, even over budget).
    """
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(suffix_lens):
        by_len.setdefault(s, []).append(i)
    batches: list[list[int]] = []
    for s in sorted(by_len, reverse=True):
        for b in plan_batches([prefix_len + s] * len(by_len[s]), max_batch_tokens):
            batches.append(sorted(by_len[s][k] for k in b))
    return batches


@torch.inference_mode()
def score_suffixes(
    backbone,
    head: RewardHead,
    prefix: Prefix,
    enc: GroupEncoded,
    *,
    device: torch.device,
    max_batch_tokens: int,
    vision=None,
    normalize_hidden: bool = False,
) -> list[float]:
    """Rewards of every candidate of ``enc`` against ``prefix``, in candidate order."""
    lm = backbone.language_model
    image_token_id = backbone.config.image_token_id
    P = prefix.length
    G = len(enc.ids)
    suffix_lens = [len(s) - P for s in enc.ids]

    # Vision tower: all candidates of this chunk in one call.
    cand_pixels = to_device(torch.cat(enc.candidate_pixels), device)
    features, deep = image_features(backbone, vision, cand_pixels, torch.cat(enc.candidate_grids), enc.codec)
    merge = backbone.config.vision_config.spatial_merge_size
    counts = [int((g.prod(-1) // (merge * merge)).sum()) for g in enc.candidate_grids]
    offsets = [0]
    for n in counts:
        offsets.append(offsets[-1] + n)

    rewards: list[float] = [0.0] * G
    for rows in plan_suffix_batches(suffix_lens, P, max_batch_tokens):
        g, S = len(rows), suffix_lens[rows[0]]
        ids = to_device(torch.stack([enc.ids[i][P:] for i in rows]), device)  # [g, S]
        positions = to_device(torch.stack([enc.positions[i][:, P:] for i in rows], dim=1), device)  # [3, g, S]
        embeds = lm.embed_tokens(ids)
        vis_mask = ids == image_token_id
        picked = torch.cat([features[offsets[i] : offsets[i + 1]] for i in rows]).to(embeds.dtype)
        embeds = embeds.masked_scatter(vis_mask.unsqueeze(-1).expand_as(embeds), picked)
        deepstack = [torch.cat([layer[offsets[i] : offsets[i + 1]] for i in rows]) for layer in deep]
        cache = DynamicCache(
            ddp_cache_data=[(k.expand(g, -1, -1, -1), v.expand(g, -1, -1, -1)) for k, v in prefix.kv],
            config=lm.config,
        )
        out = lm(
            inputs_embeds=embeds,
            attention_mask=torch.ones((g, P + S), dtype=torch.long, device=device),
            position_ids=positions,
            past_key_values=cache,
            cache_position=torch.arange(P, P + S, device=device),
            use_cache=True,
            visual_pos_masks=vis_mask,
            deepstack_visual_embeds=deepstack,
        )
        last = out.last_hidden_state[:, -1]  # every row ends at S - 1: no padding
        if normalize_hidden:
            last = torch.nn.functional.normalize(last.float(), dim=-1)
        for i, r in zip(rows, head(last).float().cpu().tolist()):
            rewards[i] = float(r)
        del cache, out
    return rewards
