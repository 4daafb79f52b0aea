"""The WORL-NVRM release preprocessing contract, as one frozen object.

Every value here comes from the release's model card (5 s candidate, 1 FPS,
height 360, JPEG quality 85, pixel bounds 1,024-76,800, thinking disabled,
raw BF16 last-token reward) or from the Qwen3-VL architecture (16-pixel
patches merged 2x2, so a resize factor of 32). The chat layout strings are
nvrm's own: the release's layout is not public, so a bundle may override any
field with an ``nvrm_contract.json`` next to its weights.

The fingerprint is the sha256 of the canonical JSON form; every score records
it, so two numbers are comparable only when their fingerprints agree.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from .errors import BundleError, ConfigError

CONTRACT_FILENAME = "nvrm_contract.json"
OFF_CONTRACT_OPTIONS = ("short_candidates", "no_context")



DTYPE_NAMES = ("bfloat16", "float16", "float32")
"""Dtypes a backbone or reward head can run in (the one list: settings and the CLI read it here)."""

@dataclass(frozen=True)
class Contract:
    """How a (prompt, context, candidate) triple becomes model input."""

    version: int = 1
    """Schema version of this object; bump when a field changes meaning."""
    candidate_seconds: float = 5.0
    """Length of the candidate continuation the model judges, in seconds."""
    sample_fps: float = 1.0
    """Frames sampled per second of video, nearest frame to each tick (ties: earlier)."""
    max_context_frames: int | None = None
    """Cap on context frames; when set, the most recent ones are kept."""
    resize_height: int = 360
    """Every frame is first resized (Pillow bicubic) to this height, width round(w*H/h)."""
    jpeg_quality: int = 85
    """Quality of the JPEG round trip each frame goes through (Pillow defaults otherwise)."""
    patch_size: int = 16
    """Vision patch size in pixels (Qwen3-VL)."""
    merge_size: int = 2
    """Spatial merge of patches (Qwen3-VL); resize factor = patch_size * merge_size."""
    min_pixels: int = 1024
    """Lower pixel bound for qwen-vl-utils smart_resize, also passed to the processor."""
    max_pixels: int = 76800
    """Upper pixel bound for qwen-vl-utils smart_resize, also passed to the processor."""
    max_aspect_ratio: float = 200.0
    """Largest long/short side ratio qwen-vl-utils accepts."""
    max_jpeg_width: int = 65535
    """Widest frame Pillow can write as JPEG; frames wider after the height resize are refused."""
    context_header: str = "{prompt}\nPreceding video:\n"
    """Text before the context frames; ``{prompt}`` is replaced by the prompt."""
    candidate_header: str = "\nCandidate continuation:\n"
    """Text between the context frames and the candidate frames."""
    add_generation_prompt: bool = True
    """Render the chat template with the assistant generation prompt at the end."""
    enable_thinking: bool = False
    """Passed to the chat template; the release disables thinking."""
    normalize_hidden: bool = False
    """Extra normalisation of the final hidden state before the head (release: none)."""
    head_dtype: str = "bfloat16"
    """Dtype the reward head runs in; the reward is that dtype's raw logit."""
    short_candidates: bool = False
    """Off-contract opt-in: a candidate shorter than ``candidate_seconds`` is scored on the 1 FPS ticks
    it has (e.g. 3 frames for a 2.06 s clip) instead of being refused. Results that used it say so in
    ``off_contract``. Left out of the canonical form while off, so the release fingerprint is unchanged."""
    no_context: bool = False
    """Off-contract opt-in: a context given as ``None`` is scored with no context frames (text-to-video
    rollouts with nothing before them). The layout keeps its text and has zero context images. The model
    was trained with a preceding video, so such rewards carry ``off_contract`` ("no context"). Without
    the opt-in a missing context is an error that names it. Left out of the canonical form while off."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not (self.candidate_seconds > 0 and math.isfinite(self.candidate_seconds)):
            problems.append(f"candidate_seconds={self.candidate_seconds!r} must be a positive number")
        if not (self.sample_fps > 0 and math.isfinite(self.sample_fps)):
            problems.append(f"sample_fps={self.sample_fps!r} must be a positive number")
        if self.max_context_frames is not None and self.max_context_frames < 1:
            problems.append(f"max_context_frames={self.max_context_frames!r} must be >= 1 or null")
        if self.resize_height < 1:
            problems.append(f"resize_height={self.resize_height!r} must be >= 1")
        if not 1 <= self.jpeg_quality <= 100:
            problems.append(f"jpeg_quality={self.jpeg_quality!r} must be in 1..100")
        if self.patch_size < 1 or self.merge_size < 1:
            problems.append("patch_size and merge_size must be >= 1")
        if not 0 < self.min_pixels <= self.max_pixels:
            problems.append(f"pixel bounds {self.min_pixels}..{self.max_pixels} must satisfy 0 < min <= max")
        if self.max_aspect_ratio < 1:
            problems.append(f"max_aspect_ratio={self.max_aspect_ratio!r} must be >= 1")
        if "{prompt}" not in self.context_header:
            problems.append("context_header must contain '{prompt}'")
        if self.head_dtype not in DTYPE_NAMES:
            problems.append(f"head_dtype={self.head_dtype!r} must be one of {', '.join(DTYPE_NAMES)}")
        if problems:
            raise ConfigError("invalid contract: " + "; ".join(problems))

    def beyond_sane_limits(self) -> list[str]:
        """Fields no real contract has (what a client checks before it samples by a contract a server published):
        a hostile or broken server must not make a client decode a million frames a second."""
        limits = {"sample_fps": (self.sample_fps, 60), "candidate_seconds": (self.candidate_seconds, 600), "resize_height": (self.resize_height, 4320),
                  "max_pixels": (self.max_pixels, 4096 * 4096), "max_context_frames": (self.max_context_frames or 0, 7200),
                  "patch_size": (self.patch_size, 64), "merge_size": (self.merge_size, 8), "max_jpeg_width": (self.max_jpeg_width, 65535)}
        return [f"{name}={value!r} > {most}" for name, (value, most) in limits.items() if value > most]

    @property
    def resize_factor(self) -> int:
        """Side lengths are rounded to multiples of this (32 for Qwen3-VL)."""
        return self.patch_size * self.merge_size

    @property
    def candidate_frames(self) -> int:
        """Number of candidate frames: one per sampling tick in the candidate window."""
        return int(round(self.candidate_seconds * self.sample_fps))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name in OFF_CONTRACT_OPTIONS:  # opt-ins appear (and change the fingerprint) only when on
            if not d[name]:
                del d[name]
        return d

    @property
    def off_contract(self) -> tuple[str, ...]:
        """The off-contract opt-ins this contract has on."""
        return tuple(name for name in OFF_CONTRACT_OPTIONS if getattr(self, name))

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace, the fingerprint's input."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON form, hex."""
        return hashlib.sha256(self.to_json().encode("ascii")).hexdigest()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "contract") -> "Contract":
        """Build from a (possibly partial) mapping; missing fields keep release defaults."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"{source}: unknown contract field(s) {', '.join(unknown)}; known fields: {', '.join(sorted(known))}"
            )
        return cls(**dict(data))

    @classmethod
    def for_bundle(cls, bundle_dir: str | Path) -> "Contract":
        """The release contract, with the bundle's ``nvrm_contract.json`` overrides if present."""
        path = Path(bundle_dir) / CONTRACT_FILENAME
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise BundleError(f"{path}: cannot read contract overrides ({e})") from e
        if not isinstance(data, dict):
            raise BundleError(f"{path}: contract overrides must be a JSON object, got {type(data).__name__}")
        try:
            return cls.from_dict(data, source=str(path))
        except (ConfigError, TypeError) as e:
            raise BundleError(f"{path}: {e}") from e


RELEASE_CONTRACT = Contract()
"""The contract exactly as the WORL-NVRM model card documents it."""
