"""Backbone + scalar head forward with the last-token readout.

The forward is ``Qwen3VLModel.forward`` spelled out (embed tokens, run the
vision tower, scatter image features into the image-token slots, run the
language model with the deepstack features), so that:

- position ids come from the engine (computed per item in the workers; the
  module's cached ``rope_deltas`` is never read or written);
- the vision tower runs through ``VisionEncoder`` (batched attention, cached
  tables) instead of its per-image loops;
- pixel values are made from the uint8 patches on the device.

Shapes: B items, L tokens (right-padded), N patches, I images, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .engine.codec import PixelCodec
from .engine.encode import Encoded, to_pixel_values

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


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

    def to(self, device: torch.device) -> "Batch":
        """Tensors the model reads on ``device`` (pinned, asynchronous on CUDA); grids stay on the CPU."""
        return Batch(
            to_device(self.input_ids, device),
            to_device(self.attention_mask, device),
            to_device(self.positions, device),
            to_device(self.pixels, device),
            self.image_grid_thw,
            to_device(self.lengths, device),
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
    return Batch(ids, mask, pos, torch.cat([it.pixels for it in items]), torch.cat([it.image_grid_thw for it in items]), lengths)


def image_features(backbone, vision, pixels: torch.Tensor, grids: torch.Tensor, codec: PixelCodec | None):
    """(merged features [tokens, H], deepstack list) for pixels already on the model's device."""
    pixel_values = to_pixel_values(pixels, codec)
    if vision is not None:
        return vision(pixel_values, grids)
    return backbone.visual(pixel_values.type(backbone.visual.dtype), grid_thw=grids.to(pixel_values.device))


def embed(backbone, vision, input_ids: torch.Tensor, pixels: torch.Tensor, grids: torch.Tensor, codec: PixelCodec | None):
    """(inputs_embeds, image-token mask, deepstack features) for token ids with their images."""
    lm = backbone.language_model
    embeds = lm.embed_tokens(input_ids)
    mask = input_ids == backbone.config.image_token_id
    features, deepstack = image_features(backbone, vision, pixels, grids, codec)
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
) -> torch.Tensor:
    """Raw rewards [B] (head dtype, usually bfloat16) at each item's last real token; ``batch`` on the device."""
    embeds, mask, deepstack = embed(backbone, vision, batch.input_ids, batch.pixels, batch.image_grid_thw, codec)
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
    return head(last)
