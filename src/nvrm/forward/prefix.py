"""Shared-context group scoring: one prefix, G candidate suffixes.

In GRPO-style RL every step scores G candidates that share the prompt and the
preceding context. The sequence of item g is ``prefix + suffix_g`` where the
prefix (chat header, prompt, context frames, "Candidate continuation:" text)
is identical for all g. So:

1. one candidate of each distinct length runs whole, as ``score`` runs it,
   keeping the prefix's KV cache (``prefill``); in RL the candidates of a
   group share their shape, so that is one forward;
2. the other suffixes (candidate frames + closing tokens) run in batches
   against that cache, expanded per row, with the 3-D positions and deepstack
   features each full sequence would have had (``score_suffixes``). A batch
   holds suffixes of one length only, so no row carries padding.

The result equals scoring each item alone: same tokens, positions and visual
features, and a prefix KV computed in a sequence of the item's own length
(attention kernels block their reductions by that length). On the CPU this is
bit-identical to ``score`` (README, "Fidelity").

Shapes: G candidates, P prefix tokens, S suffix tokens, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from transformers import DynamicCache

from .batching import plan_batches
from .compat import lm_forward
from .model import RewardHead, embed, image_features, to_device
from .readout import Tap

GroupEncoded = Any
"""A group from the engine (``nvrm.engine.encode.GroupEncoded``): ids, positions, prefix length, pixels."""


@dataclass
class Prefix:
    """The prefix's KV cache on the device, reusable across chunks of one group (and, in the service,
    across requests of one context).

    The KV is kept per *total* sequence length: attention kernels block their reductions by the
    length of the whole sequence, so the prefix's keys and values are bit-identical to those of an
    item's own forward only when they were computed in a sequence of that item's length. Each is
    made by running one candidate of that length whole (``prefill``), which also gives that
    candidate's reward; the other candidates of that length then run only their suffixes.
    """

    ids: torch.Tensor  # [P] token ids (CPU), to check a later chunk shares it
    positions: torch.Tensor  # [3, P]
    kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    """total sequence length -> per layer ([1, kv_heads, P, d] keys, values)."""

    @classmethod
    def of(cls, enc: GroupEncoded) -> "Prefix":
        """An empty prefix for ``enc``'s shared tokens (no KV yet)."""
        P = enc.prefix_len
        return cls(enc.ids[0][:P], enc.positions[0][:, :P])

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])

    def matches(self, enc: GroupEncoded) -> bool:
        return enc.prefix_len == self.length and torch.equal(enc.ids[0][: self.length], self.ids) and torch.equal(
            enc.positions[0][:, : self.length], self.positions
        )

    def missing(self, enc: GroupEncoded) -> list[int]:
        """The first row of each total length this prefix has no KV for, in row order."""
        seen = set(self.kv)
        rows = []
        for i, ids in enumerate(enc.ids):
            if len(ids) not in seen:
                seen.add(len(ids))
                rows.append(i)
        return rows


@torch.inference_mode()
def prefill(
    backbone, head: RewardHead, prefix: Prefix, enc: GroupEncoded, row: int, *, device: torch.device, vision=None, normalize_hidden: bool = False,
    tap: Tap | None = None,
) -> float:
    """Candidate ``row`` of ``enc`` whole, as ``score`` runs it: keeps the prefix's KV under its total length
    in ``prefix`` and returns the candidate's reward (a ``tap`` keeps what the guard reads, as row ``row``)."""
    lm = backbone.language_model
    P, ids = prefix.length, enc.ids[row]
    L = int(ids.shape[0])
    pixels = torch.cat([enc.context_pixels, enc.candidate_pixels[row]])
    grid = torch.cat([enc.context_grid, enc.candidate_grids[row]])
    owners = [-1] * int(enc.context_grid.shape[0]) + [row] * int(enc.candidate_grids[row].shape[0])
    embeds, mask, deepstack = embed(backbone, vision, to_device(ids.unsqueeze(0), device), to_device(pixels, device), grid, enc.codec, tap, owners)
    cache = DynamicCache(config=lm.config)
    out = lm_forward(
        lm,
        cache,
        inputs_embeds=embeds,
        attention_mask=torch.ones((1, L), dtype=torch.long, device=device),
        position_ids=to_device(enc.positions[row].unsqueeze(1), device),
        use_cache=True,
        visual_pos_masks=mask,
        deepstack_visual_embeds=deepstack,
    )
    prefix.kv[L] = [(layer.keys[:, :, :P].clone(), layer.values[:, :, :P].clone()) for layer in cache.layers]
    last = out.last_hidden_state[:, -1]
    if normalize_hidden:
        last = torch.nn.functional.normalize(last.float(), dim=-1)
    if tap is not None:
        tap.hidden([row], last)
    return float(head(last).float().cpu()[0])


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
    done: dict[int, float] | None = None,
    tap: Tap | None = None,
) -> list[float]:
    """Rewards of every candidate of ``enc`` against ``prefix``, in candidate order.

    ``done`` holds rewards already computed (by ``prefill``); those rows do not run again. Every other
    row needs ``prefix.kv`` for its total length. A ``tap`` keeps what the guard reads, candidate g as row g."""
    lm = backbone.language_model
    image_token_id = backbone.config.image_token_id
    P = prefix.length
    G = len(enc.ids)
    done = done or {}
    todo = [i for i in range(G) if i not in done]
    rewards: list[float] = [done.get(i, 0.0) for i in range(G)]
    if not todo:
        return rewards
    suffix_lens = [len(s) - P for s in enc.ids]

    # Vision tower: all remaining candidates of this chunk in one call.
    cand_pixels = to_device(torch.cat([enc.candidate_pixels[i] for i in todo]), device)
    owners = [i for i in todo for _ in range(int(enc.candidate_grids[i].shape[0]))]
    features, deep = image_features(backbone, vision, cand_pixels, torch.cat([enc.candidate_grids[i] for i in todo]), enc.codec, tap, owners)
    merge = backbone.config.vision_config.spatial_merge_size
    counts = {i: int((enc.candidate_grids[i].prod(-1) // (merge * merge)).sum()) for i in todo}
    offsets: dict[int, int] = {}
    at = 0
    for i in todo:
        offsets[i] = at
        at += counts[i]

    for batch in plan_suffix_batches([suffix_lens[i] for i in todo], P, max_batch_tokens):
        rows = [todo[k] for k in batch]
        g, S = len(rows), suffix_lens[rows[0]]
        ids = to_device(torch.stack([enc.ids[i][P:] for i in rows]), device)  # [g, S]
        positions = to_device(torch.stack([enc.positions[i][:, P:] for i in rows], dim=1), device)  # [3, g, S]
        embeds = lm.embed_tokens(ids)
        vis_mask = ids == image_token_id
        picked = torch.cat([features[offsets[i] : offsets[i] + counts[i]] for i in rows]).to(embeds.dtype)
        embeds = embeds.masked_scatter(vis_mask.unsqueeze(-1).expand_as(embeds), picked)
        deepstack = [torch.cat([layer[offsets[i] : offsets[i] + counts[i]] for i in rows]) for layer in deep]
        cache = DynamicCache(
            ddp_cache_data=[(k.expand(g, -1, -1, -1), v.expand(g, -1, -1, -1)) for k, v in prefix.kv[P + S]],
            config=lm.config,
        )
        out = lm_forward(
            lm,
            cache,
            inputs_embeds=embeds,
            attention_mask=torch.ones((g, P + S), dtype=torch.long, device=device),
            position_ids=positions,
            use_cache=True,
            visual_pos_masks=vis_mask,
            deepstack_visual_embeds=deepstack,
        )
        last = out.last_hidden_state[:, -1]  # every row ends at S - 1: no padding
        if normalize_hidden:
            last = torch.nn.functional.normalize(last.float(), dim=-1)
        if tap is not None:
            tap.hidden(rows, last)
        for i, r in zip(rows, head(last).float().cpu().tolist()):
            rewards[i] = float(r)
        del cache, out
    return rewards
