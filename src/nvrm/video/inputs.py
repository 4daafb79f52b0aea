"""What users hand in as context or candidate, and how it becomes model frames.

Accepted for either slot:
- a video (or image) file path, decoded with PyAV;
- encoded video bytes;
- ``Clip(frames, fps)``: a uint8 ``(T, H, W, 3)`` NumPy array or torch tensor,
  e.g. straight from a world model, sampled by the same 1 FPS rule on its
  frame times ``i / fps`` (no file round trip);
- a list of images (PIL images or ``(H, W, 3)`` uint8 arrays), taken as
  already sampled at the contract's rate; a single image is a one-frame clip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

import numpy as np
from PIL import Image

from ..clip import Clip, is_tensor as _is_tensor
from ..contract import Contract
from ..errors import InputError
from ..limits import Limits
from .decode import describe, is_sampled_file, read_sampled, read_sampled_file
from .frames import array_to_image, prepare_frame, to_rgb
from .sampling import SamplePlan, clip_duration, plan_candidate, plan_context

_DEFAULT_LIMITS = Limits()


ImageLike = Union[Image.Image, np.ndarray]
VideoInput = Union[str, os.PathLike, bytes, bytearray, memoryview, Clip, ImageLike, Sequence[ImageLike]]


@dataclass(frozen=True)
class PreparedVideo:
    """One input after the contract: the exact images the processor receives."""

    images: tuple[Image.Image, ...]
    """Contract-prepared frames (height 360, JPEG q85, smart-resized)."""
    times: tuple[float, ...]
    """Source presentation time (s) of each frame."""
    source: str
    """How the input is named in messages."""
    role: str = ""
    """The slot it was prepared for (``context`` or ``candidate``)."""
    contract: str = ""
    """Fingerprint of the contract that prepared it."""
    pixels: Any = field(default=None, repr=False)
    """The frames in the vision tower's patch layout (set by the engine; None until encoded)."""
    grid: Any = field(default=None, repr=False)
    """[n, 3] patch grid of each frame (set with ``pixels``)."""

    @property
    def encoded(self) -> bool:
        return self.pixels is not None


@dataclass(frozen=True)
class Sampled:
    """Frames already chosen by the sampling plan, not yet through the per-frame contract.

    What the engine hands a worker process for an in-memory clip: only the
    sampled frames travel, not the whole clip.
    """

    frames: tuple[Any, ...]
    """uint8 (H, W, 3) arrays or PIL images, one per sampled tick."""
    plan: SamplePlan
    name: str
    role: str


def _plan(
    times: Sequence[float], role: str, contract: Contract, name: str, nominal: float | None, limits: Limits | None = None
) -> SamplePlan:
    if role == "candidate":
        return plan_candidate(times, contract, name, nominal)
    limits = limits or _DEFAULT_LIMITS
    limits.check_context_duration(clip_duration(times, nominal), name)
    plan = plan_context(times, contract, name, nominal)
    limits.check_context_frames(len(plan.indices), name)
    return plan


def _image_list(value: Sequence[Any], name: str) -> list[Image.Image]:
    images = []
    for i, item in enumerate(value):
        if isinstance(item, Image.Image):
            images.append(to_rgb(item))
        elif isinstance(item, np.ndarray) or _is_tensor(item):
            arr = item.detach().cpu().numpy() if _is_tensor(item) else item
            images.append(array_to_image(np.asarray(arr), f"{name}[{i}]"))
        else:
            raise InputError(f"{name}[{i}]", f"expected a PIL image or (H, W, 3) uint8 array, got {type(item).__name__}")
    if not images:
        raise InputError(name, "image list is empty")
    return images


def _check_role(role: str) -> None:
    if role not in ("context", "candidate"):
        raise ValueError(f"role must be 'context' or 'candidate', got {role!r}")


def _clip_plan(clip: Clip, role: str, contract: Contract, limits: Limits) -> SamplePlan:
    """The checks a clip's header allows (frame rate, frame size, duration), then its sampling plan."""
    limits.check_fps(clip.fps, clip.name)
    limits.check_source(clip.width, clip.height, clip.name)
    if role == "context":
        limits.check_context_duration(len(clip) / clip.fps, clip.name)
    return _plan(clip.times, role, contract, clip.name, 1.0 / clip.fps, limits)


def presample(value: Any, role: str, contract: Contract, limits: Limits | None = None) -> Any:
    """An in-memory clip reduced to its sampled frames (cheap, pure planning); anything else unchanged.

    The frames of a ``Clip`` are copied to the host only for the ticks the
    contract samples, so a worker process receives a few frames, not a clip.
    """
    _check_role(role)
    if not isinstance(value, Clip):
        return value
    try:
        plan = _clip_plan(value, role, contract, limits or _DEFAULT_LIMITS)
    except InputError as e:
        raise e.with_role(role) from e
    if isinstance(value.frames, np.ndarray):  # views: a copy of every sampled frame at once is a second clip
        return Sampled(tuple(value.frames[i] for i in plan.indices), plan, value.name, role)
    return Sampled(tuple(value.take(plan.indices)), plan, value.name, role)


def sample_input(
    value: VideoInput, role: str, contract: Contract, limits: Limits | None = None
) -> tuple[list[Image.Image], SamplePlan, str]:
    """Sample RGB frames from any accepted input (no contract transform yet)."""
    _check_role(role)
    limits = limits or _DEFAULT_LIMITS
    try:
        if isinstance(value, Clip):
            value = presample(value, role, contract, limits)
        if isinstance(value, Sampled):
            if value.role != role:
                raise InputError(value.name, f"was sampled as {value.role}, not {role}")
            images = [f if isinstance(f, Image.Image) else array_to_image(f, value.name) for f in value.frames]
            return images, value.plan, value.name
        if is_sampled_file(value):  # frames already sampled (a record's .npy): the sampled video they are
            value = list(read_sampled_file(value, limits))  # type: ignore[arg-type]
        if isinstance(value, (str, os.PathLike, bytes, bytearray, memoryview)):
            if isinstance(value, str) and not value:
                raise InputError("''", "empty path")
            sampled = read_sampled(value, role, contract, limits=limits)
            return list(sampled.images), sampled.plan, sampled.source
        if isinstance(value, Image.Image) or (isinstance(value, np.ndarray) and value.ndim == 3):
            value = [value]
        if isinstance(value, np.ndarray) and value.ndim == 4:
            raise InputError("array", "a (T, H, W, 3) array needs its frame rate: wrap it as nvrm.Clip(frames, fps=...)")
        if isinstance(value, (list, tuple)):
            name = f"<{len(value)} images>"
            if role == "context":
                limits.check_context_frames(len(value), name)
            images = _image_list(value, name)
            for k, im in enumerate(images):
                limits.check_source(im.width, im.height, f"{name}[{k}]")
            times = [k / contract.sample_fps for k in range(len(images))]
            plan = _plan(times, role, contract, name, 1.0 / contract.sample_fps, limits)
            return [images[i] for i in plan.indices], plan, name
    except InputError as e:
        raise e.with_role(role) from e
    raise InputError(
        type(value).__name__,
        "unsupported input; pass a path, video bytes, nvrm.Clip, or a list of images",
        role=role,
    )


NO_CONTEXT = "<no context>"
"""How a missing context (``None``, under ``Contract(no_context=True)``) is named."""


def no_context(role: str, contract: Contract) -> PreparedVideo:
    """The empty context of the ``no_context`` opt-in; a missing input is an error naming its slot otherwise."""
    if role != "context":
        raise InputError("None", "no candidate given; pass the video to score", role=role)
    if not contract.no_context:
        raise InputError(
            "None", "no context given; pass the preceding video (a single image works), or opt in to scoring "
            "without one with Contract(no_context=True) (off-contract)", role=role,
        )
    return PreparedVideo((), (), NO_CONTEXT, role, contract.fingerprint)


def check_reusable(value: PreparedVideo, role: str, contract: Contract) -> PreparedVideo:
    """A PreparedVideo may be reused only in the slot and under the contract it was made for."""
    if value.role != role or value.contract != contract.fingerprint:
        raise InputError(
            value.source,
            f"was prepared as {value.role or '?'} under contract {value.contract[:12] or '?'}; "
            f"it cannot be reused as {role} under contract {contract.fingerprint[:12]}",
            role=role,
        )
    return value


def _prepared(sampled: tuple[list[Image.Image], SamplePlan, str], role: str, contract: Contract) -> PreparedVideo:
    images, plan, name = sampled
    prepared = tuple(prepare_frame(img, contract, f"{name} @ {t:.3f}s") for img, t in zip(images, plan.times))
    return PreparedVideo(prepared, plan.times, name, role, contract.fingerprint)


def prepare_input(
    value: "VideoInput | PreparedVideo", role: str, contract: Contract, limits: Limits | None = None
) -> PreparedVideo:
    """Sample and apply the per-frame contract to one context or candidate, within ``limits``.

    A ``PreparedVideo`` made by this function for the same role and contract
    passes through unchanged, so a caller can prepare once (e.g. to show the
    frames) and score without preparing again. Files are transformed frame by
    frame as they are decoded, so a large source never holds many full-size
    frames in memory.
    """
    if isinstance(value, PreparedVideo):
        return check_reusable(value, role, contract)
    _check_role(role)
    if value is None:
        return no_context(role, contract)
    try:
        if is_sampled_file(value):
            return _prepared(sample_input(value, role, contract, limits), role, contract)
        if isinstance(value, (str, os.PathLike, bytes, bytearray, memoryview)) and not (isinstance(value, str) and not value):
            name = describe(value)
            sampled = read_sampled(
                value, role, contract, limits=limits or _DEFAULT_LIMITS,
                transform=lambda img, t: prepare_frame(img, contract, f"{name} @ {t:.3f}s"),
            )
            return PreparedVideo(sampled.images, sampled.plan.times, sampled.source, role, contract.fingerprint)
        if isinstance(value, Clip):
            value = presample(value, role, contract, limits)
        if isinstance(value, Sampled) and value.role == role:
            # one full-size image at a time, each reduced to the contract's size before the next is made
            name, plan = value.name, value.plan
            prepared = tuple(
                prepare_frame(f if isinstance(f, Image.Image) else array_to_image(f, name), contract, f"{name} @ {t:.3f}s")
                for f, t in zip(value.frames, plan.times)
            )
            return PreparedVideo(prepared, plan.times, name, role, contract.fingerprint)
        images, plan, name = sample_input(value, role, contract, limits)
        prepared = tuple(prepare_frame(img, contract, f"{name} @ {t:.3f}s") for img, t in zip(images, plan.times))
    except InputError as e:
        raise e.with_role(role) from e
    return PreparedVideo(prepared, plan.times, name, role, contract.fingerprint)

