"""Cheap statistics of the frames the model saw, computed on its own patches, on its own device.

The engine ships every contract frame as uint8 patches (``[N, 3 * ps * ps]``, one row per 16x16 patch,
channel-major). The statistics here read those patches as they are, so they need no second copy of the
frames and run where the model runs; on the differentiable path the same function reads the float
patches that carry the gradient, so an attacker's gradient sees them too.

Per frame, then averaged over the clip:

- ``brightness``: mean luma (0..1);
- ``saturation``: mean of (max - min) / max over the colour channels;
- ``contrast``: standard deviation of luma;
- ``sharpness``: mean absolute Laplacian of luma inside each patch;
- ``texture``: root mean square of that Laplacian (a dense perturbation raises it with sharpness;
  sparse edges raise sharpness much more than it);
- ``change``: mean absolute difference between consecutive frames (0 for one frame, or frames of other sizes).

Shapes: N patches, I frames, K statistics, ps patch side.
"""

from __future__ import annotations

from typing import Sequence

import torch

STATS = ("brightness", "saturation", "contrast", "sharpness", "texture", "change")
"""The statistics' names, in the order ``frame_stats`` returns them."""
MONITORED = ("brightness", "saturation", "contrast", "sharpness", "change")
"""The statistics the monitor follows (``nvrm.guard.monitor``)."""


def frame_stats(patches: torch.Tensor, grids: torch.Tensor, patch_size: int) -> torch.Tensor:
    """float32 [K] statistics (``STATS``) of one clip's frames, from its patches ``[N, 3 * ps * ps]``
    (uint8 levels or float 0..255) and their grids ``[I, 3]``; zeros for a clip of no frames."""
    ps = int(patch_size)
    if patches.shape[0] == 0:
        return torch.zeros(len(STATS), dtype=torch.float32, device=patches.device)
    x = patches.to(torch.float32).reshape(-1, 3, ps, ps) / 255.0  # [N, 3, ps, ps]
    luma = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]  # [N, ps, ps]
    hi, lo = x.amax(1), x.amin(1)
    sat = (hi - lo) / hi.clamp_min(1e-3)
    lap = 4 * luma[:, 1:-1, 1:-1] - luma[:, :-2, 1:-1] - luma[:, 2:, 1:-1] - luma[:, 1:-1, :-2] - luma[:, 1:-1, 2:]
    counts = grids.prod(-1).tolist()
    per_patch = torch.stack([luma.mean((1, 2)), sat.mean((1, 2)), (luma * luma).mean((1, 2)), lap.abs().mean((1, 2)), (lap * lap).mean((1, 2))], 1)
    frames = torch.split(per_patch, counts)  # I x [n_i, 5]
    rows = []
    for f in frames:
        m = f.mean(0)
        var = (m[2] - m[0] * m[0]).clamp_min(0)
        rows.append(torch.stack([m[0], m[1], (var + 1e-12).sqrt(), m[3], (m[4] + 1e-12).sqrt()]))
    out = torch.stack(rows).mean(0)
    return torch.cat([out, _change(luma, counts).reshape(1)])


def _change(luma: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """Mean absolute luma difference between consecutive frames of equal size."""
    frames = torch.split(luma, list(counts))
    diffs = [(b - a).abs().mean() for a, b in zip(frames, frames[1:]) if a.shape == b.shape]
    if not diffs:
        return luma.new_zeros(())
    return torch.stack(diffs).mean()
