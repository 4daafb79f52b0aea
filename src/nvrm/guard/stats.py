"""Cheap statistics of the frames the model saw, computed on its own patches, on its own device.

The engine ships every contract frame as uint8 patches (``[N, 3 * ps * ps]``, one row per 16x16 patch,
channel-major). The statistics here read those patches as they are, so they need no second copy of the
frames and run where the model runs; on the differentiable path the same function reads the float
patches that carry the gradient, so an attacker's gradient sees them too.

Each frame is read on at most ``PATCHES_PER_FRAME`` of its patches, evenly spread over it (the same ones in every frame
of one size): statistics of a frame need no more, and the cost stays a small share of a forward on any model.

Per frame, then averaged over the clip:

- ``brightness``: mean luma (0..1);
- ``saturation``: mean over patches of (max - min) / max of the patch's mean colour;
- ``contrast``: standard deviation of luma;
- ``sharpness``: mean absolute Laplacian of luma inside each patch;
- ``texture``: root mean square of that Laplacian (a dense perturbation raises it with sharpness;
  sparse edges raise sharpness much more than it);
- ``change``: mean absolute difference between consecutive frames (0 for one frame, or frames of other sizes).

Shapes: N patches, I frames, K statistics, ps patch side.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch

PATCHES_PER_FRAME = 24
"""Patches of each frame the statistics read (a contract frame has at most 300: 76,800 pixels in 16x16 patches)."""
STATS = ("brightness", "saturation", "contrast", "sharpness", "texture", "change")
LUMA = torch.tensor([[0.299, 0.587, 0.114]])
"""Rec. 601 luma weights [1, 3]."""
"""The statistics' names, in the order ``frame_stats`` returns them."""
MONITORED = ("brightness", "saturation", "contrast", "sharpness", "change")
"""The statistics the monitor follows (``nvrm.guard.monitor``)."""


def frame_stats(patches: torch.Tensor, grids: torch.Tensor, patch_size: int) -> torch.Tensor:
    """float32 [K] statistics (``STATS``) of one clip's frames, from its patches ``[N, 3 * ps * ps]`` (uint8 levels or
    float 0..255) and their grids ``[I, 3]``; zeros for a clip of no frames."""
    return clip_stats([(patches, grids)], patch_size)[0]


def clip_stats(clips: Sequence[tuple[torch.Tensor, torch.Tensor]], patch_size: int) -> torch.Tensor:
    """float32 [C, K] statistics of C clips (each ``(patches, grids)``), computed together in one pass over their read patches."""
    ps = int(patch_size)
    device = clips[0][0].device
    plan = _plan(tuple(tuple(tuple(int(v) for v in row) for row in grids.tolist()) for _, grids in clips), str(device))
    out = torch.zeros(len(clips), len(STATS), dtype=torch.float32, device=device)
    parts = [patches.index_select(0, picked.to(patches.device)).to(device) for (patches, _), picked in zip(clips, plan.picked) if picked is not None]
    if not parts:
        return out
    x = torch.cat(parts).to(torch.float32).reshape(-1, 3, ps * ps)  # [n, 3, ps*ps] levels
    luma = (LUMA.to(device) @ x / 255.0).reshape(-1, ps, ps)  # [n, ps, ps]
    colour = x.mean(2) / 255.0  # [n, 3] each patch's mean colour
    hi, lo = colour.amax(1), colour.amin(1)
    lap = 4 * luma[:, 1:-1, 1:-1] - luma[:, :-2, 1:-1] - luma[:, 2:, 1:-1] - luma[:, 1:-1, :-2] - luma[:, 1:-1, 2:]
    per_patch = torch.stack([luma.mean((1, 2)), (hi - lo) / hi.clamp_min(1e-3), (luma * luma).mean((1, 2)), lap.abs().mean((1, 2)),
                             (lap * lap).mean((1, 2))], 1)
    sums = torch.zeros(plan.frames, 5, dtype=torch.float32, device=device).index_add(0, plan.frame_of, per_patch)
    m = sums / plan.per_frame_count  # [F, 5] per-frame means
    per_frame = torch.stack([m[:, 0], m[:, 1], (m[:, 2] - m[:, 0] * m[:, 0]).clamp_min(0).add(1e-12).sqrt(), m[:, 3], m[:, 4].add(1e-12).sqrt()], 1)
    out = torch.cat([torch.zeros(len(clips), 5, device=device).index_add(0, plan.clip_of_frame, per_frame) / plan.frames_per_clip, out[:, 5:]], 1)
    if plan.pairs is not None:
        first, second, pc, per_clip_pairs = plan.pairs
        change = (luma[second] - luma[first]).abs().mean((1, 2))
        per_clip = torch.zeros(len(clips), device=device).index_add(0, pc, change) / per_clip_pairs
        out = torch.cat([out[:, :5], per_clip.unsqueeze(1)], 1)
    return out


@dataclass(frozen=True)
class _Plan:
    """Which patches ``clip_stats`` reads and where each one's numbers go, for one layout of clips (index tensors on one device)."""

    picked: tuple[torch.Tensor | None, ...]  # per clip: the patches read, as indices into its own patches
    frames: int  # F: frames of all clips
    frame_of: torch.Tensor  # [n] the frame of each read patch
    per_frame_count: torch.Tensor  # [F, 1] read patches per frame (at least 1), float32
    clip_of_frame: torch.Tensor  # [F] the clip of each frame
    frames_per_clip: torch.Tensor  # [C, 1] frames per clip (at least 1), float32
    pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None  # (patch in frame f, the same in f+1, clip, pairs per clip)


@functools.lru_cache(maxsize=64)
def _plan(layout: tuple[tuple[tuple[int, ...], ...], ...], device: str) -> _Plan:
    """The plan for clips whose grids are ``layout`` (per clip, its frames' (t, h, w)): pure, and cached, since an RL
    run's groups keep one layout, so the per-patch index lists are built once instead of at every call."""
    picked, frame_of, pairs_a, pairs_b, pair_clip, frames_per_clip = [], [], [], [], [], []
    at = frame = 0
    for c, grids in enumerate(layout):
        counts, chosen = _spread(tuple(t * h * w for t, h, w in grids))
        picked.append(torch.as_tensor(chosen, device=device) if chosen else None)
        starts = [at + sum(counts[:f]) for f in range(len(counts))]
        for f, k in enumerate(counts):
            frame_of += [frame + f] * k
        for f in range(len(counts) - 1):  # consecutive frames of one size: the same patches, read in both
            if counts[f] == counts[f + 1] and grids[f] == grids[f + 1]:
                pairs_a += range(starts[f], starts[f] + counts[f])
                pairs_b += range(starts[f + 1], starts[f + 1] + counts[f])
                pair_clip += [c] * counts[f]
        frames_per_clip.append(len(counts))
        at += sum(counts)
        frame += len(counts)
    fid = torch.as_tensor(frame_of, dtype=torch.long, device=device)
    pairs = None
    if pairs_a:
        pc = torch.as_tensor(pair_clip, device=device)
        pairs = (torch.as_tensor(pairs_a, device=device), torch.as_tensor(pairs_b, device=device), pc,
                 torch.bincount(pc, minlength=len(layout)).clamp_min(1))
    return _Plan(
        tuple(picked), frame, fid, torch.bincount(fid, minlength=frame).clamp_min(1).unsqueeze(1).to(torch.float32),
        torch.as_tensor([c for c, n in enumerate(frames_per_clip) for _ in range(n)], dtype=torch.long, device=device),
        torch.as_tensor(frames_per_clip, device=device, dtype=torch.float32).clamp_min(1).unsqueeze(1), pairs,
    )


@functools.lru_cache(maxsize=256)
def _spread(counts: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(patches read per frame, their indices into the clip's patches): at most ``PATCHES_PER_FRAME`` per frame, evenly spread (pure)."""
    per, picked, start = [], [], 0
    for n in counts:
        k = min(n, PATCHES_PER_FRAME)
        picked += [start + (i * n) // k for i in range(k)]
        per.append(k)
        start += n
    return tuple(per), tuple(picked)
