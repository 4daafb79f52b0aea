"""Candidate suffixes with gradients: the reward as a differentiable function of candidate pixels.

The shared prefix (chat header, prompt, context frames) is prefilled once without gradient by
``prefix.prefill``, exactly as group scoring does; here the candidates' suffixes run against that
KV with autograd on, so ``d reward / d pixel values`` flows through the vision tower and the text
layers, while the weights (frozen) get none. Values equal ``prefix.score_suffixes``' (the same
tokens, positions, features and kernels), hence ``score``'s on the CPU.

Activation checkpointing (``checkpoint=True``) recomputes each vision block and each text layer
in the backward pass instead of keeping its activations. The prefix's KV is held by a cache whose
``update`` only concatenates and stores nothing, so a recomputed layer sees exactly what the first
pass saw.

Shapes: G candidates, P prefix tokens, S suffix tokens.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Iterator, Sequence

import torch
from torch.utils.checkpoint import checkpoint as _checkpoint
from transformers import DynamicCache

from .compat import lm_forward
from .model import RewardHead, image_features, to_device
from .prefix import Prefix
from .readout import Tap
from .vision import checkpointing as vision_checkpointing


class FrozenPrefixCache(DynamicCache):
    """A prefix KV that layers read but never extend: ``update`` returns prefix + new keys/values."""

    def __init__(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: int, config) -> None:
        super().__init__(ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in kv], config=config)
        self._prefix = [(layer.keys, layer.values) for layer in self.layers]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """The prefix's keys and values followed by the new ones (extra arguments, which differ between
        transformers versions, are not needed)."""
        k, v = self._prefix[layer_idx]
        return torch.cat([k, key_states], dim=-2), torch.cat([v, value_states], dim=-2)


@contextlib.contextmanager
def checkpointed_layers(layers: Sequence[torch.nn.Module], on: bool) -> Iterator[None]:
    """Within the block, each of ``layers`` recomputes its forward in the backward pass (non-reentrant)."""
    if not on:
        yield
        return
    for layer in layers:
        layer.forward = functools.partial(_recomputed, type(layer).forward.__get__(layer))
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def _recomputed(forward, *args, **kwargs):
    """``forward`` checkpointed (non-reentrant), recomputed in the context it first ran in: the packed batch's
    segments (``model._SEGMENTS``) are a context variable, and a recomputation without them would attend across items."""
    ctx = contextvars.copy_context()
    return _checkpoint(lambda *a, **k: ctx.run(forward, *a, **k), *args, use_reentrant=False, **kwargs)


def suffix_rewards(
    backbone,
    head: RewardHead,
    prefix: Prefix,
    enc: Any,
    pixel_values: Sequence[torch.Tensor],
    *,
    device: torch.device,
    vision=None,
    normalize_hidden: bool = False,
    checkpoint: bool = True,
    tap: Tap | None = None,
) -> torch.Tensor:
    """Rewards [G] of ``enc``'s candidates with autograd on, given each candidate's float32 pixel values
    (``pixel_values[g]``: [N_g, C*T*ps*ps], possibly requiring grad). All candidates must share one
    total length, and ``prefix.kv`` must hold it (``prefill``). A ``tap`` keeps what the guard reads
    (candidate g as row g), with its graph."""
    lm = backbone.language_model
    P, G = prefix.length, len(enc.ids)
    lengths = {int(ids.shape[0]) for ids in enc.ids}
    if len(lengths) != 1:
        raise ValueError(f"candidates of one differentiable call must share their sequence length, got {sorted(lengths)}")
    L = lengths.pop()
    kv = [(k.clone(), v.clone()) for k, v in prefix.kv[L]]  # out of inference mode: autograd may save them
    with torch.enable_grad(), vision_checkpointing(checkpoint), checkpointed_layers(lm.layers, checkpoint):
        owners = [g for g in range(G) for _ in range(int(enc.candidate_grids[g].shape[0]))]
        features, deep = image_features(backbone, vision, torch.cat(list(pixel_values)), torch.cat(list(enc.candidate_grids)), None, tap, owners)
        ids = to_device(torch.stack([s[P:] for s in enc.ids]), device)  # [G, S]
        positions = to_device(torch.stack([p[:, P:] for p in enc.positions], dim=1), device)  # [3, G, S]
        embeds = lm.embed_tokens(ids)
        vis_mask = ids == backbone.config.image_token_id
        embeds = embeds.masked_scatter(vis_mask.unsqueeze(-1).expand_as(embeds), features.to(embeds.dtype))
        out = lm_forward(
            lm,
            FrozenPrefixCache(kv, G, lm.config),
            inputs_embeds=embeds,
            attention_mask=torch.ones((G, L), dtype=torch.long, device=device),
            position_ids=positions,
            use_cache=True,
            visual_pos_masks=vis_mask,
            deepstack_visual_embeds=deep,
        )
        last = out.last_hidden_state[:, -1]
        if normalize_hidden:
            last = torch.nn.functional.normalize(last.float(), dim=-1)
        if tap is not None:
            tap.hidden(range(G), last)
        return head(last).float()
