"""Pixels on the model's device: the uint8 patches the engine ships -> the processor's float32 values.

The engine's workers cut contract frames into uint8 patches in the processor's layout
(``nvrm.engine.codec.PixelCodec``); normalising them happens here, after the upload, where the
vision tower runs. Only the codec's numbers are read (patch size, temporal patch size, mean, std),
so the forward needs nothing from the preprocessing engine.
"""

from __future__ import annotations

from typing import Any

import torch


def to_pixel_values(pixels: torch.Tensor, codec: Any) -> torch.Tensor:
    """uint8 [N, C*ps*ps] patches -> float32 [N, C*T*ps*ps], exactly the processor's values;
    float pixel values (or no codec) pass unchanged. Runs wherever ``pixels`` lives."""
    if codec is None or pixels.dtype != torch.uint8:
        return pixels
    return levels_to_pixel_values(pixels.to(torch.float32), codec)


def levels_to_pixel_values(levels: torch.Tensor, codec: Any) -> torch.Tensor:
    """float32 [N, C*ps*ps] patches of 0..255 levels -> float32 [N, C*T*ps*ps] pixel values: the one
    normalisation both the uint8 path and the differentiable reward use (so their values agree bit for bit)."""
    n, ps = levels.shape[0], codec.patch_size
    x = levels.reshape(n, 3, ps * ps)
    mean = torch.tensor(codec.mean, dtype=torch.float32, device=x.device).view(1, 3, 1)
    std = torch.tensor(codec.std, dtype=torch.float32, device=x.device).view(1, 3, 1)
    x = (x - mean) / std
    t = codec.temporal_patch_size
    return x.unsqueeze(2).expand(n, 3, t, x.shape[-1]).reshape(n, 3 * t * ps * ps)
