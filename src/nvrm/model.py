"""Backbone + scalar head forward with the last-token readout.

Shapes: B items, L tokens (right-padded), P patches, I images, H hidden.

Position ids (3-D multimodal RoPE) are computed explicitly for every call
from the batch's own tokens and image grids. ``Qwen3VLModel.forward`` would
otherwise cache ``rope_deltas`` on the module, state that concurrent calls on
one model would share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .prompt import Encoded

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
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    pixel_values: torch.Tensor  # [P, C]
    image_grid_thw: torch.Tensor  # [I, 3]
    lengths: torch.Tensor  # [B]

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        def move(t: torch.Tensor) -> torch.Tensor:
            if device.type == "cuda" and t.device.type == "cpu":
                t = t.pin_memory()
            return t.to(device, non_blocking=non_blocking)

        return Batch(*(move(t) for t in (self.input_ids, self.attention_mask, self.pixel_values, self.image_grid_thw, self.lengths)))


def collate(items: Sequence[Encoded], pad_id: int) -> Batch:
    """Right-pad token ids; concatenate patches and grids in item order."""
    lengths = torch.tensor([it.num_tokens for it in items], dtype=torch.long)
    width = int(lengths.max())
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for i, it in enumerate(items):
        ids[i, : it.num_tokens] = it.input_ids
        mask[i, : it.num_tokens] = 1
    return Batch(
        ids,
        mask,
        torch.cat([it.pixel_values for it in items]),
        torch.cat([it.image_grid_thw for it in items]),
        lengths,
    )


def position_ids(backbone, batch: Batch) -> torch.Tensor:
    """[3, B, L] multimodal positions; pure function of the batch (no module state)."""
    pos, _ = backbone.get_rope_index(batch.input_ids, batch.image_grid_thw, None, batch.attention_mask)
    return pos


def forward_rewards(
    backbone, head: RewardHead, batch: Batch, *, positions: torch.Tensor | None = None, normalize_hidden: bool = False
) -> torch.Tensor:
    """Raw rewards [B] (head dtype, usually bfloat16) at each item's last real token.

    ``positions`` ([3, B, L]) may be precomputed on the CPU batch: get_rope_index
    walks tokens in Python and would force device syncs on GPU tensors.
    """
    pixel_values = batch.pixel_values.to(backbone.visual.dtype)
    if positions is None:
        positions = position_ids(backbone, batch)
    out = backbone(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=positions.to(batch.input_ids.device),
        pixel_values=pixel_values,
        image_grid_thw=batch.image_grid_thw,
        use_cache=False,
    )
    rows = torch.arange(batch.input_ids.shape[0], device=batch.input_ids.device)
    last = out.last_hidden_state[rows, batch.lengths - 1]  # [B, H]
    if normalize_hidden:
        last = nn.functional.normalize(last.float(), dim=-1)
    return head(last)
