"""Contract frames -> the vision tower's pixel input, split between CPU and device.

The bundle's image processor turns each contract frame into float32 patches:
``(x - mean) / std`` per channel (rescale by 1/255 fused into mean and std),
the frame repeated over the temporal patch, laid out merge-block by
merge-block. Everything but the affine step is a permutation of the uint8
pixels, so the workers do the permutation (``patchify``, pure NumPy) and ship
one uint8 byte per pixel; the affine step and the temporal repeat run on the
model's device when a batch is assembled (``to_pixel_values``). That moves
eight times fewer bytes between processes and to the GPU, and takes the image
processor's Python overhead out of the workers.

Elementwise float32 subtract and divide are correctly rounded on CPU and CUDA,
and commute with the permutation, so the result equals the processor's own
output bit for bit. ``PixelCodec.for_processor`` proves that on probe frames
of the model's own processor and returns ``None`` when it does not hold (an
unusual processor class or setting); the engine then runs the processor
itself in the workers and ships its float32 output.

Shapes: N patches, C channels, T temporal patch, ps patch side, m merge.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from PIL import Image

log = logging.getLogger("nvrm")


@dataclass(frozen=True)
class PixelCodec:
    """The processor's patch layout and normalisation, as plain numbers."""

    patch_size: int
    """Side of a vision patch in pixels (16 for Qwen3-VL)."""
    temporal_patch_size: int
    """Frames per temporal patch; a still frame is repeated this many times (2)."""
    merge_size: int
    """Patches merged per side into one language-model token (2)."""
    mean: tuple[float, float, float]
    """Per-channel float32 value subtracted from the uint8 pixel (rescale fused in)."""
    std: tuple[float, float, float]
    """Per-channel float32 divisor after the subtraction (rescale fused in)."""

    @property
    def patch_bytes(self) -> int:
        """uint8 values per patch as shipped: C * ps * ps (one temporal slice)."""
        return 3 * self.patch_size * self.patch_size

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """(t, h, w) patch grid of one still frame."""
        return (1, height // self.patch_size, width // self.patch_size)

    def patchify(self, image: np.ndarray) -> np.ndarray:
        """uint8 (H, W, 3) -> uint8 [gh * gw, 3 * ps * ps] in the processor's patch order."""
        ps, m = self.patch_size, self.merge_size
        h, w = image.shape[:2]
        gh, gw = h // ps, w // ps
        x = image.reshape(gh // m, m, ps, gw // m, m, ps, 3)
        # -> (gh/m, gw/m, m_h, m_w, C, ps_h, ps_w): merge blocks, then channel-major patches
        x = x.transpose(0, 3, 1, 4, 6, 2, 5)
        return np.ascontiguousarray(x).reshape(gh * gw, 3 * ps * ps)

    def encode(self, images: Sequence[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
        """Contract frames -> (uint8 patches [N, C*ps*ps], grid [n, 3] int64)."""
        parts, grids = [], []
        for im in images:
            arr = np.asarray(im.convert("RGB") if im.mode != "RGB" else im)
            parts.append(self.patchify(arr))
            grids.append(self.grid(arr.shape[0], arr.shape[1]))
        return torch.from_numpy(np.concatenate(parts)), torch.tensor(grids, dtype=torch.long)

    def to_pixel_values(self, patches: torch.Tensor) -> torch.Tensor:
        """uint8 [N, C*ps*ps] -> float32 [N, C*T*ps*ps], exactly the processor's values (``nvrm.forward.pixels``)."""
        from ..forward.pixels import to_pixel_values

        return to_pixel_values(patches, self)

    @classmethod
    def for_processor(cls, processor, min_pixels: int, max_pixels: int) -> "PixelCodec | None":
        """The codec of ``processor``'s image processor, or None if it cannot reproduce it exactly."""
        ip = getattr(processor, "image_processor", None)
        try:
            ps, t, m = int(ip.patch_size), int(ip.temporal_patch_size), int(ip.merge_size)
            if not (ip.do_rescale and ip.do_normalize):
                return None
            factor = 1.0 / float(ip.rescale_factor)
            # the processor fuses rescale into normalisation with float32 tensors
            mean = (torch.tensor(list(ip.image_mean), dtype=torch.float32) * factor).tolist()
            std = (torch.tensor(list(ip.image_std), dtype=torch.float32) * factor).tolist()
            if len(mean) != 3 or len(std) != 3:
                return None
            codec = cls(ps, t, m, tuple(mean), tuple(std))  # type: ignore[arg-type]
        except (AttributeError, TypeError, ValueError) as e:
            log.info("fast pixel codec off: the processor's settings cannot be read (%s: %s); the processor encodes", type(e).__name__, e)
            return None
        if not codec._matches(processor, min_pixels, max_pixels):
            log.info("fast pixel codec off: it does not reproduce this processor bit for bit; the processor encodes")
            return None
        return codec

    def _matches(self, processor, min_pixels: int, max_pixels: int) -> bool:
        """Bit-identity with the processor on probe frames (landscape, portrait, square)."""
        rng = np.random.default_rng(0)
        side = self.patch_size * self.merge_size
        probes = [(2 * side, 3 * side), (4 * side, side), (2 * side, 2 * side)]
        images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in probes]
        try:
            from ..forward.compat import pixel_bounds

            ref = processor.image_processor(images=images, return_tensors="pt", **pixel_bounds(min_pixels, max_pixels))
        except (AttributeError, TypeError, ValueError, RuntimeError) as e:  # this processor cannot be probed
            log.info("fast pixel codec probe failed (%s: %s)", type(e).__name__, e)
            return False
        patches, grid = self.encode(images)
        ours = self.to_pixel_values(patches)
        return (
            torch.equal(grid, ref["image_grid_thw"])
            and ours.dtype == ref["pixel_values"].dtype
            and torch.equal(ours, ref["pixel_values"])
        )
