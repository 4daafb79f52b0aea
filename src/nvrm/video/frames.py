"""Per-frame transform of the release contract.

RGB frame -> height-360 bicubic resize (width round(w*360/h)) -> JPEG q85
round trip with Pillow defaults -> qwen-vl-utils 0.0.14 ``fetch_image``
semantics (smart resize to multiples of 32 within 1,024-76,800 pixels,
Pillow's default bicubic ``resize``).

Frames the contract cannot encode are refused up front with a message that
says why, instead of failing deep inside Pillow or qwen-vl-utils.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image
from qwen_vl_utils.vision_process import smart_resize

from ..contract import Contract
from ..errors import ContractError, InputError


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB the way qwen-vl-utils does it: RGBA is composited on white."""
    if image.mode == "RGBA":
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image, mask=image.split()[3])
        return background
    return image.convert("RGB") if image.mode != "RGB" else image


def height_resized_width(width: int, height: int, contract: Contract) -> int:
    return int(round(width * contract.resize_height / height))


def check_encodable(width: int, height: int, contract: Contract, source: str) -> None:
    """Refuse frames the contract cannot carry, before any resizing."""
    if width < 1 or height < 1:
        raise InputError(source, f"frame is {width}x{height}; it has no pixels")
    ratio = max(width, height) / min(width, height)
    if ratio > contract.max_aspect_ratio:
        raise ContractError(
            source,
            f"frame is {width}x{height} (aspect ratio {ratio:.1f}:1); the contract accepts at most "
            f"{contract.max_aspect_ratio:g}:1 (qwen-vl-utils' limit)",
        )
    new_width = height_resized_width(width, height, contract)
    if new_width > contract.max_jpeg_width:
        raise ContractError(
            source,
            f"frame is {width}x{height}; resized to height {contract.resize_height} it would be {new_width} px wide, "
            f"over JPEG's {contract.max_jpeg_width} px limit (aspect ratio {ratio:.1f}:1)",
        )
    if new_width < 1:
        raise ContractError(source, f"frame is {width}x{height}; at height {contract.resize_height} it has no width")
    # qwen-vl-utils' smart_resize floors each side to a multiple of 32 when it
    # shrinks into max_pixels; past ~75:1 (landscape) the height floors to 0
    # and the reference fetch_image fails inside Pillow.
    w, h = contract_size(new_width, contract.resize_height, contract)
    if w < 1 or h < 1:
        raise ContractError(
            source,
            f"frame is {width}x{height} (aspect ratio {ratio:.1f}:1); the contract's smart resize would make it "
            f"{w}x{h} px, which cannot be encoded (landscape frames above ~75:1 are not representable)",
        )


def jpeg_roundtrip(image: Image.Image, quality: int) -> Image.Image:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)
    buf.seek(0)
    out = Image.open(buf)
    out.load()
    return out.convert("RGB") if out.mode != "RGB" else out


def contract_size(width: int, height: int, contract: Contract) -> tuple[int, int]:
    """(width, height) after smart resize for an image of the given size."""
    try:
        h, w = smart_resize(
            height, width, factor=contract.resize_factor, min_pixels=contract.min_pixels, max_pixels=contract.max_pixels
        )
    except ValueError as e:  # qwen-vl-utils' aspect-ratio guard
        raise ContractError(f"{width}x{height} frame", str(e)) from e
    return w, h


def prepare_frame(image: Image.Image, contract: Contract, source: str = "frame") -> Image.Image:
    """One RGB frame -> the exact image the model's processor receives."""
    image = to_rgb(image)
    width, height = image.size
    check_encodable(width, height, contract, source)
    image = image.resize((height_resized_width(width, height, contract), contract.resize_height), Image.BICUBIC)
    image = jpeg_roundtrip(image, contract.jpeg_quality)
    w, h = contract_size(*image.size, contract)
    return image.resize((w, h), Image.BICUBIC)


def array_to_image(frame: np.ndarray, source: str) -> Image.Image:
    """A uint8 (H, W, 3) array -> PIL RGB image."""
    if frame.dtype != np.uint8:
        raise InputError(source, f"frames must be uint8, got {frame.dtype}")
    if frame.ndim != 3 or frame.shape[-1] != 3:
        raise InputError(source, f"a frame must have shape (H, W, 3), got {tuple(frame.shape)}")
    return Image.fromarray(np.ascontiguousarray(frame))
