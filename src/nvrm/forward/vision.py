"""Qwen3-VL's vision tower without per-image Python loops.

transformers 4.57 runs the tower's attention with sdpa one image at a time
(a G=64 group of 5-frame candidates is 320 images x 24 layers = 7,680 small
attention calls) and rebuilds the position-embedding interpolation and the
rotary tables per image, in Python, on every call. ``VisionEncoder`` runs the
same modules with the same weights, but:

- images of equal patch count attend in one batched sdpa call (one call per
  distinct size; an RL group usually has one or two sizes);
- the interpolated position embeddings and the rotary cos/sin of each
  distinct grid are computed once and cached. They are nvrm's own
  (``vision_tables``: transformers 4.57.6's arithmetic, which 5.9 changed), so
  the tower gives the release's features on every transformers.

Each image still attends only to itself, through the same kernels, so the
features equal the tower's own up to the attention kernel's reduction order
(identical on CPU in the tests; bf16 noise at most elsewhere, see README).

Shapes: N patches (all images), L patches of one image, n images of one size,
H heads, d head dim, D width.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import OrderedDict
from typing import Iterator

import torch
import torch.utils.checkpoint
import torch.nn.functional as F

from .vision_tables import apply_rotary, pos_embed_interpolate, rotary_freqs, rotary_inv_freq

_CACHE_GRIDS = 64
_CHECKPOINT: contextvars.ContextVar[bool] = contextvars.ContextVar("nvrm_vision_checkpoint", default=False)


@contextlib.contextmanager
def checkpointing(on: bool) -> Iterator[None]:
    """Within the block, a grad-enabled ``VisionEncoder`` call recomputes each block in the backward pass."""
    token = _CHECKPOINT.set(on)
    try:
        yield
    finally:
        _CHECKPOINT.reset(token)


class VisionEncoder:
    """``visual(pixel_values, grid_thw)`` with batched attention and cached tables."""

    def __init__(self, visual, attention: str = "sdpa"):
        self.visual = visual
        self.eager = attention == "eager"
        """Attention as transformers' eager kernel (matmul, float32 softmax) instead of SDPA."""
        cfg = visual.config
        self.merge = int(cfg.spatial_merge_size)
        self._inv_freq = rotary_inv_freq(int(cfg.hidden_size) // int(cfg.num_heads))
        self._tables: "OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]" = OrderedDict()

    def _grid_tables(self, grid: tuple[int, int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(position embeddings [L, D], cos [L, d], sin [L, d]) of one grid, cached while weights are frozen."""
        v = self.visual
        weight = v.pos_embed.weight
        frozen = not torch.is_grad_enabled() or not weight.requires_grad
        key = (grid, device, weight.dtype, weight.data_ptr(), _version(weight))
        hit = self._tables.get(key) if frozen else None
        if hit is not None:
            self._tables.move_to_end(key)
            return hit
        pos = pos_embed_interpolate(weight, grid, self.merge)
        rot = rotary_freqs(grid, self.merge, self._inv_freq.to(device))
        emb = torch.cat((rot, rot), dim=-1)
        tables = (pos, emb.cos(), emb.sin())
        if frozen:
            self._tables[key] = tables
            while len(self._tables) > _CACHE_GRIDS:
                self._tables.popitem(last=False)
        return tables

    def __call__(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Merged image features [N / merge^2, out] and the deepstack features, like ``visual(...)``."""
        v = self.visual
        device = pixel_values.device
        grids = [tuple(int(x) for x in row) for row in grid_thw.tolist()]
        hidden = v.patch_embed(pixel_values.type(v.dtype))
        tables = [self._grid_tables(g, device) for g in grids]
        hidden = hidden + torch.cat([t[0] for t in tables])
        cos = torch.cat([t[1] for t in tables])
        sin = torch.cat([t[2] for t in tables])
        plan = _AttentionPlan(grids, device, self.eager)
        deepstack = []
        recompute = _CHECKPOINT.get() and torch.is_grad_enabled()
        for layer, block in enumerate(v.blocks):
            if recompute:
                hidden = torch.utils.checkpoint.checkpoint(_block, block, hidden, cos, sin, plan, use_reentrant=False)
            else:
                hidden = _block(block, hidden, cos, sin, plan)
            if layer in v.deepstack_visual_indexes:
                merger = v.deepstack_merger_list[v.deepstack_visual_indexes.index(layer)]
                deepstack.append(merger(hidden))
        return v.merger(hidden), deepstack


def _version(t: torch.Tensor) -> int:
    """In-place modification counter (inference tensors have none: they cannot change outside inference mode)."""
    try:
        return t._version
    except RuntimeError:
        return -1


class _AttentionPlan:
    """Which patch rows attend together: images grouped by patch count.

    ``order`` sorts the rows so each size's images are contiguous (None when
    they already are, the usual case); ``runs`` is (count, length) per size.
    """

    def __init__(self, grids: list[tuple[int, int, int]], device: torch.device, eager: bool = False):
        self.eager = eager
        # a (t, h, w) grid is t frames of h * w patches, each attending to itself
        frames: list[int] = []
        for t, h, w in grids:
            frames += [h * w] * t
        starts = [0]
        for n in frames:
            starts.append(starts[-1] + n)
        by_len: dict[int, list[int]] = {}
        for i, n in enumerate(frames):
            by_len.setdefault(n, []).append(i)
        self.runs = [(len(idx), n) for n, idx in by_len.items()]
        sorted_frames = [i for idx in by_len.values() for i in idx]
        if sorted_frames == list(range(len(frames))):
            self.order = None
        else:
            rows = [torch.arange(starts[i], starts[i + 1]) for i in sorted_frames]
            self.order = torch.cat(rows).to(device)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _AttentionPlan, scale: float) -> torch.Tensor:
    """[N, H, d] q, k, v -> [N, H * d], each image attending only to itself."""
    N, H, d = q.shape
    if plan.order is not None:
        q, k, v = q[plan.order], k[plan.order], v[plan.order]
    outs = []
    start = 0
    for count, length in plan.runs:
        stop = start + count * length

        def heads_first(x: torch.Tensor) -> torch.Tensor:
            return x[start:stop].view(count, length, H, d).transpose(1, 2)  # [n, H, L, d]

        if plan.eager:
            o = _eager(heads_first(q), heads_first(k), heads_first(v), scale)
        else:
            o = F.scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v), scale=scale, is_causal=False)
        outs.append(o.transpose(1, 2).reshape(count * length, H * d))
        start = stop
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    if plan.order is not None:
        out = torch.empty_like(out).index_copy_(0, plan.order, out)
    return out


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """transformers' eager attention arithmetic: [n, H, L, d] -> [n, H, L, d]."""
    weights = torch.matmul(q, k.transpose(2, 3)) * scale
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


def _block(block, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: _AttentionPlan) -> torch.Tensor:
    """One ``Qwen3VLVisionBlock`` with the batched attention."""
    attn = block.attn
    x = block.norm1(hidden)
    n = x.shape[0]
    q, k, v = attn.qkv(x).reshape(n, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    q, k = apply_rotary(q, k, cos, sin)
    hidden = hidden + attn.proj(_attention(q, k, v, plan, attn.scaling).contiguous())
    return hidden + block.mlp(block.norm2(hidden))
