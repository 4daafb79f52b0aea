"""The vision tower's position tables, owned by nvrm (the release's arithmetic, transformers 4.57.6).

Per image grid the tower adds interpolated learned position embeddings to the patch embeddings and
rotates queries and keys by 2-D rotary tables. transformers computes both in methods of its vision
model (``fast_pos_embed_interpolate``, ``rot_pos_emb``) that 5.9 changed and 5.11 removed: from
5.9 the four bilinear terms are summed in float32 and cast once, which moves the release's rewards
(1.2266 -> 1.1953 on the demo bundle). The reward is defined by 4.57.6's arithmetic, reproduced
here step by step:

- the bilinear weights are computed in float32 on the CPU, then cast to the embedding's dtype;
- each of the four terms is ``embedding * weight`` in that dtype, and they are summed left to
  right in that dtype;
- the rotary frequencies are ``outer(arange(max(h, w)), inv_freq)`` in float32 with
  ``inv_freq = 1 / 10000 ** (arange(0, dim, 2) / dim)``.

Shapes: L patches of one image (t * h * w), D vision width, d head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ROTARY_THETA = 10000.0
"""The vision rotary base (fixed in Qwen3-VL's vision tower)."""


def pos_embed_interpolate(weight: torch.Tensor, grid: tuple[int, int, int], merge: int) -> torch.Tensor:
    """[L, D] position embeddings of one ``(t, h, w)`` grid from the learned table ``weight`` [n*n, D]."""
    t, h, w = grid
    n = int(weight.shape[0] ** 0.5)
    h_idxs = torch.linspace(0, n - 1, h)
    w_idxs = torch.linspace(0, n - 1, w)
    h_floor, w_floor = h_idxs.int(), w_idxs.int()
    h_ceil = (h_floor + 1).clip(max=n - 1)
    w_ceil = (w_floor + 1).clip(max=n - 1)
    dh, dw = h_idxs - h_floor, w_idxs - w_floor
    base_h, base_h_ceil = h_floor * n, h_ceil * n
    indices = [
        (base_h[None].T + w_floor[None]).flatten(),
        (base_h[None].T + w_ceil[None]).flatten(),
        (base_h_ceil[None].T + w_floor[None]).flatten(),
        (base_h_ceil[None].T + w_ceil[None]).flatten(),
    ]
    weights = [
        ((1 - dh)[None].T * (1 - dw)[None]).flatten(),
        ((1 - dh)[None].T * dw[None]).flatten(),
        (dh[None].T * (1 - dw)[None]).flatten(),
        (dh[None].T * dw[None]).flatten(),
    ]
    idx = torch.stack(indices).to(device=weight.device, dtype=torch.long)  # [4, h*w]
    # float32 weights cast to the table's dtype, as 4.57.6's torch.tensor(list, dtype=...) does
    wts = torch.stack(weights).to(device=weight.device, dtype=weight.dtype)  # [4, h*w]
    terms = F.embedding(idx, weight) * wts[:, :, None]  # [4, h*w, D] in the table's dtype
    pos = terms[0] + terms[1] + terms[2] + terms[3]
    pos = pos.repeat(t, 1)
    return pos.view(t, h // merge, merge, w // merge, merge, -1).permute(0, 1, 3, 2, 4, 5).flatten(0, 4)


def rotary_inv_freq(head_dim: int) -> torch.Tensor:
    """float32 [head_dim // 4] inverse frequencies of the vision rotary embedding (on the CPU)."""
    dim = head_dim // 2
    return 1.0 / (ROTARY_THETA ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def rotary_freqs(grid: tuple[int, int, int], merge: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """[L, head_dim // 2] rotary angles (row, column) of one grid's patches, in merge-block order."""
    t, h, w = grid
    device = inv_freq.device
    seq = torch.arange(max(h, w), device=device, dtype=inv_freq.dtype)
    table = torch.outer(seq, inv_freq)  # [max(h, w), head_dim // 4]
    mh, mw = h // merge, w // merge
    block_rows = torch.arange(mh, device=device)
    block_cols = torch.arange(mw, device=device)
    intra = torch.arange(merge, device=device)
    rows = (block_rows[:, None, None, None] * merge + intra[None, None, :, None]).expand(mh, mw, merge, merge).reshape(-1)
    cols = (block_cols[None, :, None, None] * merge + intra[None, None, None, :]).expand(mh, mw, merge, merge).reshape(-1)
    coords = torch.stack((rows, cols), dim=-1)
    if t > 1:
        coords = coords.repeat(t, 1)
    return table[coords].flatten(1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [N, H, d] rotated by cos, sin [N, d], in float32, cast back to their dtypes."""
    q_dtype, k_dtype = q.dtype, k.dtype
    q, k = q.float(), k.float()
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed.to(q_dtype), k_embed.to(k_dtype)
