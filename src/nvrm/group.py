"""Shared-context group scoring: one prefix, G candidate suffixes.

In GRPO-style RL every step scores G candidates that share the prompt and the
preceding context. The sequence of item g is ``prefix + suffix_g`` where the
prefix (chat header, prompt, context frames, "Candidate continuation:" text)
is identical for all g. So:

1. the context frames go through the image processor and the vision tower once;
2. the language model runs over the prefix once, keeping its KV cache;
3. all suffixes (candidate frames + closing tokens) run as one batch against
   that cache, expanded per candidate, with the 3-D multimodal position ids
   and deepstack features each full sequence would have had.

The result equals scoring each item alone (same tokens, same positions, same
visual features); only floating-point reduction order differs.

Shapes: G candidates, P prefix tokens, S suffix tokens (right-padded), H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from PIL import Image
from transformers import DynamicCache

from .batching import plan_batches
from .contract import Contract
from .prompt import images_kwargs, render
from .model import RewardHead


@dataclass(frozen=True)
class GroupEncoded:
    """Model inputs for one group; ``ids[g]`` is candidate g's full sequence."""

    ids: list[torch.Tensor]  # G x [P + S_g]
    prefix_len: int  # P
    context_pixels: torch.Tensor  # [patches, C]
    context_grid: torch.Tensor  # [n_ctx, 3]
    candidate_pixels: list[torch.Tensor]  # G x [patches_g, C]
    candidate_grids: list[torch.Tensor]  # G x [n_cand, 3]


def _expand_image_tokens(text: str, grids: torch.Tensor, image_token: str, merge: int) -> str:
    """What the processor does to the text: one <|image_pad|> per merged patch."""
    parts = text.split(image_token)
    if len(parts) - 1 != grids.shape[0]:
        raise ValueError(f"template has {len(parts) - 1} image slots for {grids.shape[0]} images")
    counts = (grids.prod(-1) // (merge * merge)).tolist()
    return parts[0] + "".join(image_token * n + rest for n, rest in zip(counts, parts[1:]))


def encode_group(
    processor,
    prompt: str,
    context: Sequence[Image.Image],
    candidates: Sequence[Sequence[Image.Image]],
    contract: Contract,
) -> GroupEncoded:
    """Tokenise every full sequence but run the image processor on the context once."""
    ip = processor.image_processor
    kw = images_kwargs(contract)
    ctx = ip(images=list(context), return_tensors="pt", **kw)
    image_token = processor.image_token
    vision_start = processor.tokenizer.convert_tokens_to_ids(processor.vision_start_token)
    ids, pixels, grids = [], [], []
    texts: dict[int, str] = {}
    for frames in candidates:
        cand = ip(images=list(frames), return_tensors="pt", **kw)
        if len(frames) not in texts:
            texts[len(frames)] = render(processor, prompt, len(context), len(frames), contract)
        text = _expand_image_tokens(
            texts[len(frames)], torch.cat([ctx["image_grid_thw"], cand["image_grid_thw"]]), image_token, ip.merge_size
        )
        ids.append(processor.tokenizer(text, return_tensors="pt", padding=False)["input_ids"][0])
        pixels.append(cand["pixel_values"])
        grids.append(cand["image_grid_thw"])
    # Prefix = everything before the first candidate image's <|vision_start|>.
    starts = (ids[0] == vision_start).nonzero().flatten()
    prefix_len = int(starts[len(context)])
    for seq in ids[1:]:
        if not torch.equal(seq[:prefix_len], ids[0][:prefix_len]):  # pragma: no cover - a template bug
            raise RuntimeError("candidate sequences do not share the context prefix")
    return GroupEncoded(ids, prefix_len, ctx["pixel_values"], ctx["image_grid_thw"], pixels, grids)


def _positions(backbone, enc: GroupEncoded, pad_id: int) -> torch.Tensor:
    """[3, G, P + S_max] positions of the full, right-padded sequences."""
    width = max(len(s) for s in enc.ids)
    ids = torch.full((len(enc.ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for g, seq in enumerate(enc.ids):
        ids[g, : len(seq)] = seq
        mask[g, : len(seq)] = 1
    grids = torch.cat([torch.cat([enc.context_grid, cg]) for cg in enc.candidate_grids])
    pos, _ = backbone.get_rope_index(ids, grids, None, mask)
    return pos


def _tokens_per_image(grid: torch.Tensor, merge: int) -> int:
    return int((grid.prod(-1) // (merge * merge)).sum())


@torch.inference_mode()
def forward_group(
    backbone,
    head: RewardHead,
    enc: GroupEncoded,
    *,
    pad_id: int,
    device: torch.device,
    max_batch_tokens: int,
    normalize_hidden: bool = False,
) -> list[float]:
    """Rewards for every candidate of a group, reusing the prefix's KV cache."""
    lm = backbone.language_model
    image_token_id = backbone.config.image_token_id
    merge = backbone.visual.spatial_merge_size
    P = enc.prefix_len
    positions = _positions(backbone, enc, pad_id).to(device)  # [3, G, P + S_max]

    # Vision tower: context once, all candidates in one call.
    ctx_embeds, ctx_deep = backbone.get_image_features(enc.context_pixels.to(device), enc.context_grid.to(device))
    cand_grid_all = torch.cat(enc.candidate_grids)
    cand_embeds, cand_deep = backbone.get_image_features(torch.cat(enc.candidate_pixels).to(device), cand_grid_all.to(device))
    cand_embeds = torch.cat(cand_embeds)
    counts = [_tokens_per_image(g, merge) for g in enc.candidate_grids]
    offsets = [0]
    for n in counts:
        offsets.append(offsets[-1] + n)

    # Prefix: one forward, cache kept.
    prefix_ids = enc.ids[0][:P].unsqueeze(0).to(device)  # [1, P]
    embeds = lm.embed_tokens(prefix_ids)
    prefix_mask = prefix_ids == image_token_id  # [1, P]
    embeds = embeds.masked_scatter(prefix_mask.unsqueeze(-1), torch.cat(ctx_embeds).to(embeds.dtype))
    cache = DynamicCache(config=lm.config)
    lm(
        inputs_embeds=embeds,
        attention_mask=torch.ones((1, P), dtype=torch.long, device=device),
        position_ids=positions[:, :1, :P],
        past_key_values=cache,
        use_cache=True,
        visual_pos_masks=prefix_mask,
        deepstack_visual_embeds=ctx_deep,
    )
    prefix_kv = [(layer.keys, layer.values) for layer in cache.layers]

    rewards: list[float] = [0.0] * len(enc.ids)
    suffix_lens = [len(s) - P for s in enc.ids]
    # Budget: each suffix token attends to P + S keys; count the suffix tokens plus the expanded prefix.
    for chunk in plan_batches([s + P for s in suffix_lens], max_batch_tokens):
        chunk = sorted(chunk)
        g = len(chunk)
        S = max(suffix_lens[i] for i in chunk)
        ids = torch.full((g, S), pad_id, dtype=torch.long)
        valid = torch.zeros((g, S), dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, : suffix_lens[i]] = enc.ids[i][P:]
            valid[row, : suffix_lens[i]] = 1
        ids, valid = ids.to(device), valid.to(device)
        embeds = lm.embed_tokens(ids)
        vis_mask = (ids == image_token_id) & valid.bool()  # [g, S]
        picked = torch.cat([cand_embeds[offsets[i] : offsets[i + 1]] for i in chunk]).to(embeds.dtype)
        embeds = embeds.masked_scatter(vis_mask.unsqueeze(-1), picked)
        deep = [torch.cat([layer[offsets[i] : offsets[i + 1]] for i in chunk]) for layer in cand_deep]
        cache_g = DynamicCache(
            ddp_cache_data=[(k.expand(g, -1, -1, -1), v.expand(g, -1, -1, -1)) for k, v in prefix_kv],
            config=lm.config,
        )
        rows = torch.tensor(chunk, device=device)
        out = lm(
            inputs_embeds=embeds,
            attention_mask=torch.cat([torch.ones((g, P), dtype=torch.long, device=device), valid], dim=1),
            position_ids=positions[:, rows, P : P + S],
            past_key_values=cache_g,
            cache_position=torch.arange(P, P + S, device=device),
            use_cache=True,
            visual_pos_masks=vis_mask,
            deepstack_visual_embeds=deep,
        )
        last_idx = torch.tensor([suffix_lens[i] - 1 for i in chunk], device=device)
        last = out.last_hidden_state[torch.arange(g, device=device), last_idx]
        if normalize_hidden:
            last = torch.nn.functional.normalize(last.float(), dim=-1)
        for i, r in zip(chunk, head(last).float().cpu().tolist()):
            rewards[i] = float(r)
        del cache_g, out
    return rewards
