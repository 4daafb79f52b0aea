"""Bounds on the work one input may cause, each checked before that work starts.

Defaults never reject a realistic RL or evaluation input (a prompt of a few
paragraphs, minutes of context, 8K sources, groups of thousands) and keep
the worst case that passes them bounded (README, "Limits"). Every error
names the limit, the value seen and the setting that raises it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import ConfigError, LimitError
from ._fields import meta as _help




@dataclass(frozen=True)
class Limits:
    """Work bounds; the CLI flag of each is ``--<name with dashes>``."""

    max_prompt_tokens: int = field(default=4096, metadata=_help("tokens the prompt alone may have"))
    max_sequence_tokens: int = field(default=32768, metadata=_help("tokens one full model sequence may have"))
    max_context_seconds: float = field(default=600.0, metadata=_help("seconds of context video that may be decoded"))
    max_context_samples: int = field(
        default=600,
        metadata=_help("sampled context frames an input may have; more is refused (the contract's own max_context_frames keeps only the latest)"),
    )
    max_group_candidates: int = field(default=4096, metadata=_help("candidates in one group (groups are scored in chunks)"))
    max_source_pixels: int = field(
        default=8192 * 4320, metadata=_help("width x height of a source frame, read from the stream header before decoding")
    )
    min_fps: float = field(default=0.1, metadata=_help("lowest frame rate accepted for in-memory clips and streams"))
    max_fps: float = field(default=1000.0, metadata=_help("highest frame rate accepted for in-memory clips and streams"))
    max_request_items: int = field(default=256, metadata=_help("items (or candidates) in one service request"))

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                problems.append(f"{f.name}={value!r} must be a positive number")
        if not problems and self.min_fps > self.max_fps:
            problems.append(f"min_fps={self.min_fps} is above max_fps={self.max_fps}")
        if problems:
            raise ConfigError("invalid limits: " + "; ".join(problems))

    # ------------------------------------------------------------ checks

    @staticmethod
    def _fail(where: str, fact: str, name: str, limit: Any) -> LimitError:
        flag = "--" + name.replace("_", "-")
        return LimitError(where, f"{fact}, over the limit {name}={limit:g} (raise it with {flag} if this is intended)")

    def check_fps(self, fps: float, where: str) -> None:
        if not (self.min_fps <= fps <= self.max_fps):
            raise LimitError(
                where,
                f"frame rate {fps:g} fps is outside min_fps={self.min_fps:g} .. max_fps={self.max_fps:g} "
                "(set --min-fps / --max-fps if this is intended)",
            )

    def check_source(self, width: int, height: int, where: str) -> None:
        if width * height > self.max_source_pixels:
            raise self._fail(where, f"source frames are {width}x{height} ({width * height} pixels)", "max_source_pixels", self.max_source_pixels)

    def check_context_duration(self, seconds: float, where: str) -> None:
        if not math.isfinite(seconds) or seconds > self.max_context_seconds:
            raise self._fail(where, f"context is {seconds:.6g} s long", "max_context_seconds", self.max_context_seconds)

    def check_context_frames(self, n: int, where: str) -> None:
        if n > self.max_context_samples:
            raise self._fail(where, f"context has {n} sampled frames", "max_context_samples", self.max_context_samples)

    def check_prompt_tokens(self, n: int) -> None:
        if n > self.max_prompt_tokens:
            raise self._fail("prompt", f"has {n} tokens", "max_prompt_tokens", self.max_prompt_tokens)

    PROMPT_BYTES_PER_TOKEN = 64
    """A prompt longer than this many bytes per allowed token is refused without tokenising it."""

    def check_prompt_bytes(self, size: int) -> None:
        """Refuse, unread, a prompt of ``size`` UTF-8 bytes that no tokenisation could fit in the limit."""
        if size > self.PROMPT_BYTES_PER_TOKEN * self.max_prompt_tokens:
            raise self._fail(
                "prompt", f"is {size} bytes, more than {self.PROMPT_BYTES_PER_TOKEN} bytes per token allows (refused without tokenising)",
                "max_prompt_tokens", self.max_prompt_tokens,
            )

    def check_sequence_tokens(self, n: int, where: str = "item") -> None:
        if n > self.max_sequence_tokens:
            raise self._fail(where, f"model sequence has {n} tokens", "max_sequence_tokens", self.max_sequence_tokens)

    def check_group(self, n: int, where: str = "group") -> None:
        if n > self.max_group_candidates:
            raise self._fail(where, f"has {n} candidates", "max_group_candidates", self.max_group_candidates)

    def check_request_items(self, n: int, where: str = "request") -> None:
        if n > self.max_request_items:
            raise self._fail(where, f"has {n} items", "max_request_items", self.max_request_items)
