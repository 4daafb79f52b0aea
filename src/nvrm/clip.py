"""``Clip``: frames in memory (NumPy or torch), with their frame rate.

Kept free of torch, Pillow and the decoder so the HTTP client can build and
send clips without loading the runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .errors import InputError


def is_tensor(value: Any) -> bool:
    """A torch tensor, recognised without importing torch."""
    return hasattr(value, "detach") and hasattr(value, "cpu") and hasattr(value, "dtype")


FLOAT_OVERSHOOT = 0.5
"""How far float frames may stray outside [0, 1] and still be clamped (a decoder's overshoot); further out, the
scale is wrong (0..255 frames not divided by 255, or frames in [-1, 1]) and clamping would score a white or black video."""


def float_range_problem(lo: float, hi: float) -> str | None:
    """Why float frames whose values span ``[lo, hi]`` are not frames in [0, 1] (None: they are, or they overshoot
    by at most ``FLOAT_OVERSHOOT``, which is clamped). The one rule of the RL adapters and the differentiable reward."""
    if hi > 1 + FLOAT_OVERSHOOT:
        return f"values up to {round(hi, 3)!r} where float frames are in [0, 1]: divide by 255 (frames in 0..255)"
    if lo < -FLOAT_OVERSHOOT:
        return f"values down to {round(lo, 3)!r} where float frames are in [0, 1]: map them with (x + 1) / 2 (frames in [-1, 1])"
    return None


@dataclass(frozen=True, eq=False)
class Clip:
    """Decoded frames in memory: uint8 ``(T, H, W, 3)`` at ``fps`` frames per second.

    A torch tensor stays where it is (a GPU tensor straight from a world
    model's decoder included): only the frames the contract samples are ever
    copied to the host.
    """

    frames: Any
    """NumPy array or torch tensor of shape (T, H, W, 3), dtype uint8, RGB."""
    fps: float
    """Frame rate of ``frames``; frame i is at time i / fps."""
    name: str = field(default="Clip")
    """How the clip is named in messages."""

    def __post_init__(self) -> None:
        frames = self.frames
        if not is_tensor(frames):
            frames = np.asarray(frames)
        dtype = str(frames.dtype).replace("torch.", "")
        if dtype != "uint8":
            raise InputError(self.name, f"frames must be uint8, got {dtype}")
        shape = tuple(frames.shape)
        if len(shape) != 4 or shape[-1] != 3:
            raise InputError(self.name, f"frames must have shape (T, H, W, 3), got {shape}")
        if shape[0] == 0:
            raise InputError(self.name, "clip has zero frames")
        if isinstance(self.fps, bool) or not (isinstance(self.fps, (int, float)) and math.isfinite(self.fps) and self.fps > 0):
            raise InputError(self.name, f"fps must be a positive number, got {self.fps!r}")
        object.__setattr__(self, "frames", frames)

    def __len__(self) -> int:
        return int(self.frames.shape[0])

    def __repr__(self) -> str:
        t, h, w, _ = self.frames.shape
        return f"Clip({self.name!r}, {t} frames of {w}x{h} at {self.fps:g} fps)"

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    @property
    def times(self) -> list[float]:
        return [i / self.fps for i in range(len(self))]

    def take(self, indices: Sequence[int]) -> np.ndarray:
        """uint8 (k, H, W, 3) host array of the frames at ``indices`` (only those are copied)."""
        idx = list(indices)
        if is_tensor(self.frames):
            import torch

            sel = torch.as_tensor(idx, dtype=torch.long, device=self.frames.device)
            return self.frames.detach().index_select(0, sel).cpu().numpy()
        return np.asarray(self.frames[idx])

    def numpy(self) -> np.ndarray:
        """All frames as one host array."""
        return self.take(range(len(self)))
