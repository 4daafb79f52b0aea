"""Backbone + scalar head forward with the last-token readout.

The forward is ``Qwen3VLModel.forward`` spelled out (embed tokens, run the
vision tower, scatter image features into the image-token slots, run the
language model with the deepstack features), so that:

- position ids come from the engine (computed per item in the workers; the
  module's cached ``rope_deltas`` is never read or written);
- the vision tower runs through ``VisionEncoder`` (batched attention, cached
  tables) instead of its per-image loops;
- pixel values are made from the uint8 patches on the device;
- a batch runs **packed**: its items are laid end to end in one row, every
  layer's matmuls run over all of them at once, and attention runs per item
  with the same causal SDPA call (same shapes, same kernel) that item gets
  alone. On CPU this makes ``score_batch`` bit-identical to ``score`` and wastes
  no work on padding. (Right padding instead sends attention through a masked
  kernel whose reductions differ by a few bf16 ulps.) Packing replaces plain
  ``sdpa`` only; other attention implementations run right-padded.

Shapes: B items, L tokens (right-padded), T packed tokens, N patches, I images, H hidden.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from .pixels import to_pixel_values
from .readout import Tap, item_owners

PixelCodec = Any
"""The engine's ``PixelCodec`` (only its numbers are read: ``nvrm.forward.pixels``)."""
Encoded = Any
"""An encoded item from the engine: ``input_ids``, ``positions``, ``pixels``, ``image_grid_thw``, ``num_tokens``."""

PACKED_ATTENTION = "nvrm_packed_sdpa"
"""The language model's attention implementation when packing is on: SDPA, run per packed item."""

_SEGMENTS: ContextVar[tuple[tuple[int, int], ...] | None] = ContextVar("nvrm_packed_segments", default=None)


def _packed_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, called once per packed item when a packed forward is running.

    Outside a packed forward (``score``, prefills, cached suffixes, training without packing) this is
    exactly transformers' ``sdpa_attention_forward``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    segments = _SEGMENTS.get()
    if segments is None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outs = [
        sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, **kwargs)[0]
        for a, b in segments
    ]
    return torch.cat(outs, dim=1), None


def enable_packing(backbone) -> bool:
    """Route the language model's attention through ``_packed_sdpa``; only from plain ``sdpa``.

    Returns whether batches of this backbone run packed.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = backbone.language_model.config
    if config._attn_implementation == PACKED_ATTENTION:
        return True
    if config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(PACKED_ATTENTION, _packed_sdpa)
    AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)
    config._attn_implementation = PACKED_ATTENTION
    return True


def is_packed(backbone) -> bool:
    return getattr(backbone.language_model.config, "_attn_implementation", None) == PACKED_ATTENTION


DTYPES = {name: getattr(torch, name) for name in ("bfloat16", "float16", "float32")}
"""torch dtypes by name (the same names as ``nvrm.contract.DTYPE_NAMES``; the forward imports nothing else of nvrm)."""


class RewardHead(nn.Module):
    """``rm_head``: hidden [.., H] -> raw logit [..]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
        self.bias = nn.Parameter(bias.to(dtype), requires_grad=False) if bias is not None else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.to(self.weight.dtype)
        return nn.functional.linear(hidden, self.weight, self.bias).squeeze(-1)


@dataclass
class Batch:
    """Right-padded items, ready for one forward pass."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    positions: torch.Tensor  # [3, B, L]
    pixels: torch.Tensor  # [N, D] uint8 patches or float32 pixel values
    image_grid_thw: torch.Tensor  # [I, 3], stays on the CPU
    lengths: torch.Tensor  # [B]
    owners: tuple[int, ...] = ()
    """Per image: the item whose candidate it belongs to, or -1 for a context image (``readout.item_owners``)."""

    def to(self, device: torch.device) -> "Batch":
        """Tensors the model reads on ``device`` (pinned, asynchronous on CUDA); grids stay on the CPU."""
        return Batch(
            to_device(self.input_ids, device),
            to_device(self.attention_mask, device),
            to_device(self.positions, device),
            to_device(self.pixels, device),
            self.image_grid_thw,
            to_device(self.lengths, device),
            self.owners,
        )


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def collate(items: Sequence[Encoded], pad_id: int) -> Batch:
    """Right-pad token ids and positions (pads at position 1, as transformers does); concatenate pixels."""
    lengths = torch.tensor([it.num_tokens for it in items], dtype=torch.long)
    width = int(lengths.max())
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    pos = torch.ones((3, len(items), width), dtype=torch.long)
    for i, it in enumerate(items):
        n = it.num_tokens
        ids[i, :n] = it.input_ids
        mask[i, :n] = 1
        pos[:, i, :n] = it.positions
    owners = item_owners([int(it.image_grid_thw.shape[0]) for it in items], [getattr(it, "candidate_images", 0) for it in items])
    return Batch(ids, mask, pos, torch.cat([it.pixels for it in items]), torch.cat([it.image_grid_thw for it in items]), lengths, tuple(owners))


def image_features(backbone, vision, pixels: torch.Tensor, grids: torch.Tensor, codec: PixelCodec | None, tap: Tap | None = None,
                   owners: Sequence[int] = ()):
    """(merged features [tokens, H], deepstack list) for pixels already on the model's device, through
    ``vision`` (a ``VisionEncoder``; one is made for ``backbone`` when None). A ``tap`` keeps the mean
    feature of each image ``owners`` gives a candidate row (``nvrm.forward.readout``)."""
    if vision is None:
        from .vision import VisionEncoder

        vision = VisionEncoder(backbone.visual, getattr(backbone.visual.config, "_attn_implementation", "sdpa"))
    features, deepstack = vision(to_pixel_values(pixels, codec), grids)
    if tap is not None:
        tap.images(features, grids, owners)
    return features, deepstack


def embed(backbone, vision, input_ids: torch.Tensor, pixels: torch.Tensor, grids: torch.Tensor, codec: PixelCodec | None,
          tap: Tap | None = None, owners: Sequence[int] = ()):
    """(inputs_embeds, image-token mask, deepstack features) for token ids with their images."""
    lm = backbone.language_model
    embeds = lm.embed_tokens(input_ids)
    mask = input_ids == backbone.config.image_token_id
    features, deepstack = image_features(backbone, vision, pixels, grids, codec, tap, owners)
    embeds = embeds.masked_scatter(mask.unsqueeze(-1).expand_as(embeds), features.to(embeds.device, embeds.dtype))
    return embeds, mask, deepstack


def forward_rewards(
    backbone,
    head: RewardHead,
    batch: Batch,
    *,
    vision=None,
    codec: PixelCodec | None = None,
    normalize_hidden: bool = False,
    tap: Tap | None = None,
) -> torch.Tensor:
    """Raw rewards [B] (head dtype, usually bfloat16) at each item's last real token; ``batch`` on the device.
    A ``tap`` keeps what the guard reads (``nvrm.forward.readout``), item i as row i."""
    if is_packed(backbone) and batch.input_ids.shape[0] > 1:
        return _packed_rewards(backbone, head, batch, vision=vision, codec=codec, normalize_hidden=normalize_hidden, tap=tap)
    embeds, mask, deepstack = embed(backbone, vision, batch.input_ids, batch.pixels, batch.image_grid_thw, codec, tap, batch.owners)
    out = backbone.language_model(
        inputs_embeds=embeds,
        attention_mask=batch.attention_mask,
        position_ids=batch.positions,
        visual_pos_masks=mask,
        deepstack_visual_embeds=deepstack,
        use_cache=False,
    )
    rows = torch.arange(batch.input_ids.shape[0], device=batch.input_ids.device)
    last = out.last_hidden_state[rows, batch.lengths - 1]  # [B, H]
    if normalize_hidden:
        last = nn.functional.normalize(last.float(), dim=-1)
    if tap is not None:
        tap.hidden(range(len(rows)), last)
    return head(last)


def _packed_rewards(backbone, head: RewardHead, batch: Batch, *, vision, codec, normalize_hidden: bool, tap: Tap | None = None) -> torch.Tensor:
    """``forward_rewards`` with the batch's items end to end in one row (module docstring)."""
    lengths = batch.lengths.tolist()
    ids = torch.cat([batch.input_ids[i, :n] for i, n in enumerate(lengths)]).unsqueeze(0)  # [1, T]
    positions = torch.cat([batch.positions[:, i, :n] for i, n in enumerate(lengths)], dim=1).unsqueeze(1)  # [3, 1, T]
    ends, start = [], 0
    for n in lengths:
        ends.append(start + n)
        start += n
    segments = tuple(zip([0, *ends[:-1]], ends))
    embeds, mask, deepstack = embed(backbone, vision, ids, batch.pixels, batch.image_grid_thw, codec, tap, batch.owners)
    token = _SEGMENTS.set(segments)
    try:
        out = backbone.language_model(
            inputs_embeds=embeds,
            attention_mask=torch.ones_like(ids),  # all real: the mask is skipped and each item runs causal
            position_ids=positions,
            visual_pos_masks=mask,
            deepstack_visual_embeds=deepstack,
            use_cache=False,
        )
    finally:
        _SEGMENTS.reset(token)
    last = out.last_hidden_state[0, torch.tensor(ends, device=ids.device) - 1]  # [B, H]
    if normalize_hidden:
        last = nn.functional.normalize(last.float(), dim=-1)
    if tap is not None:
        tap.hidden(range(len(lengths)), last)
    return head(last)
