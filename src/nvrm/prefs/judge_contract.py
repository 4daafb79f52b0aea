"""What a vision-language judge is shown: the judge contract (frames, sizes, encoding) and the rubric template.

The judge contract is separate from the reward contract: a judge sees what it is built to see, not
the reward model's 1 FPS, 360-pixel JPEGs. It is a frozen, fingerprinted object like the reward
contract, and each judgment row records its fingerprint, so judgments made under other settings
are never mixed up unknowingly.

The rubric is a text template (a file, or the default below) with placeholders the judge's message
is built from: ``{prompt}`` (text), ``{context}``, ``{first}`` and ``{second}`` (each replaced by
that video's frames as images). ``{prompt}``, ``{first}`` and ``{second}`` are required. Other
braces (a JSON example, say) are left as they are. Its sha256 goes into every row.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._fields import meta
from ..errors import ConfigError, InputError

PLACEHOLDERS = ("prompt", "context", "first", "second")
REQUIRED = ("prompt", "first", "second")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")

DEFAULT_RUBRIC = """You compare two candidate continuations of one video.

The prompt the video follows: {prompt}

The last frames of the preceding video:
{context}

Continuation FIRST:
{first}

Continuation SECOND:
{second}

Which continuation is the better next few seconds of the preceding video under the prompt? Judge motion \
continuity with the preceding frames, physical plausibility, consistency of objects and scene, and visual quality.
Answer with one JSON object and nothing else: {"winner": "first"} or {"winner": "second"}, or {"winner": "tie"} \
when neither is better."""


@dataclass(frozen=True)
class JudgeContract:
    """How each video becomes images for a judge."""

    fps: float = field(default=2.0, metadata=meta("frames per second sampled from each video shown to the judge", flag="--judge-fps"))
    max_frames: int = field(default=8, metadata=meta("at most this many images per candidate, evenly spaced over it"))
    context_seconds: float = field(default=2.0, metadata=meta("the context's last seconds shown"))
    max_context_frames: int = field(default=4, metadata=meta("at most this many images of the context (0: the context is not shown)"))
    height: int = field(default=256, metadata=meta("images are resized to this height (width by the aspect ratio, even)", flag="--image-height"))
    jpeg_quality: int = field(default=85, metadata=meta("JPEG quality of the images sent"))

    def __post_init__(self) -> None:
        checks = {"fps": 0 < self.fps <= 30, "max_frames": 1 <= self.max_frames <= 64, "context_seconds": 0 <= self.context_seconds <= 600,
                  "max_context_frames": 0 <= self.max_context_frames <= 64, "height": 16 <= self.height <= 2048, "jpeg_quality": 1 <= self.jpeg_quality <= 100}
        bad = [f"{k}={getattr(self, k)!r}" for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"judge contract: {', '.join(bad)} out of range")

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    def times(self, duration: float, role: str) -> list[float]:
        """Source times to show of a video lasting ``duration`` s (pure)."""
        step = 1.0 / self.fps
        if role == "context":
            start = max(0.0, duration - self.context_seconds)
            ticks = [start + k * step for k in range(int(self.context_seconds * self.fps) + 1) if start + k * step < duration]
            return ticks[-self.max_context_frames:] if self.max_context_frames else []
        ticks = [k * step for k in range(int(duration * self.fps) + 1) if k * step < duration]
        if len(ticks) > self.max_frames:
            ticks = [ticks[round(i * (len(ticks) - 1) / (self.max_frames - 1))] for i in range(self.max_frames)] if self.max_frames > 1 else ticks[:1]
        return ticks


def video_images(path: str, role: str, contract: JudgeContract) -> list[str]:
    """``data:image/jpeg;base64,...`` URLs of the frames of ``path`` the judge contract shows."""
    import numpy as np
    from PIL import Image

    from ..video.decode import decode_frames

    frames, rate = decode_frames(path)
    duration = len(frames) / rate
    urls = []
    for t in contract.times(duration, role):
        frame = frames[min(len(frames) - 1, int(round(t * rate)))]
        image = Image.fromarray(np.ascontiguousarray(frame))
        width = max(2, round(image.width * contract.height / image.height / 2) * 2)
        buf = io.BytesIO()
        image.resize((width, contract.height), Image.BICUBIC).save(buf, format="JPEG", quality=contract.jpeg_quality)
        urls.append("data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"))
    return urls


@dataclass(frozen=True)
class Rubric:
    """A checked rubric template."""

    text: str
    source: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @classmethod
    def load(cls, path: str | Path | None) -> "Rubric":
        """The rubric in ``path`` (the default one when None); one line naming what is missing otherwise."""
        if path is None:
            return cls(DEFAULT_RUBRIC, "default")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(str(path), f"cannot read the rubric template ({e})") from e
        found = set(_PLACEHOLDER.findall(text))
        unknown = sorted(found - set(PLACEHOLDERS))
        missing = [p for p in REQUIRED if p not in found]
        if missing or unknown:
            parts = ([f"lacks {', '.join('{' + m + '}' for m in missing)}"] if missing else []) + (
                [f"has unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}"] if unknown else [])
            raise InputError(str(path), f"the rubric template {' and '.join(parts)}; it needs {{prompt}}, {{first}} and {{second}} ({{context}} is optional)")
        return cls(text, str(path))

    def content(self, prompt: str, images: dict[str, list[str]]) -> list[dict[str, Any]]:
        """The message's content parts: the template's text with each video placeholder replaced by its images."""
        parts: list[dict[str, Any]] = []
        pos = 0
        text = self.text
        for m in _PLACEHOLDER.finditer(text):
            name = m.group(1)
            if name not in PLACEHOLDERS:
                continue
            before = text[pos : m.start()]
            if name == "prompt":
                parts.append({"type": "text", "text": before + prompt})
            else:
                if before:
                    parts.append({"type": "text", "text": before})
                parts += [{"type": "image_url", "image_url": {"url": url}} for url in images.get(name, [])]
            pos = m.end()
        if pos < len(text):
            parts.append({"type": "text", "text": text[pos:]})
        merged: list[dict[str, Any]] = []
        for p in parts:  # adjacent text parts as one
            if merged and p["type"] == "text" and merged[-1]["type"] == "text":
                merged[-1] = {"type": "text", "text": merged[-1]["text"] + p["text"]}
            else:
                merged.append(p)
        return merged
