"""Everything that differs between the transformers versions nvrm supports (4.57.6 through 5.x), in one place.

The arithmetic that defines the reward is nvrm's own (``rope``, ``vision_tables``); what remains
version-specific is how transformers' public modules are called:

- the language model's KV-cache keyword: ``past_key_values`` (4.57 and early 5.x), ``cache``
  (later 5.x, where ``past_key_values`` is deprecated, to be removed in 5.40);
- building the bare ``Qwen3VLModel`` from a config with an attention implementation and dtype;
- the image processor's pixel bounds: 4.57 takes ``min_pixels`` / ``max_pixels`` keywords, 5.x
  warns on them and takes ``size={"shortest_edge", "longest_edge"}``; both read that ``size``.

``tests/unit/test_compat.py`` holds each helper against the installed transformers.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

import transformers

VERSION: tuple[int, int, int] = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:3])  # type: ignore[assignment]
"""The installed transformers, as (major, minor, patch)."""

TESTED_RANGE = ("4.57.6", "5.25.0")
"""The oldest and newest transformers nvrm is tested on (README, "Supported transformers"); newer ones are accepted
and checked at load (``nvrm.engine.selfcheck``)."""

SHARES_RELEASE_VISION_NUMERICS = VERSION < (5, 9, 0)
"""Whether transformers' own Qwen3-VL vision tower computes 4.57.6's position embeddings (5.9 sums the
interpolation in float32): only there does its own forward give the release's rewards."""


@functools.lru_cache(maxsize=None)
def _forward_params(cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def lm_forward(lm, cache, **kwargs):
    """``lm(**kwargs)`` with the KV cache ``cache`` under this transformers' keyword (the positions it
    already holds give the new tokens' cache positions, as every version computes them)."""
    kwargs["cache" if "cache" in _forward_params(type(lm)) else "past_key_values"] = cache
    return lm(**kwargs)


def build_backbone(config, attn_implementation: str, dtype):
    """A bare ``Qwen3VLModel`` for ``config`` (weights wherever the caller's init context puts them)."""
    from transformers import Qwen3VLModel

    return Qwen3VLModel._from_config(config, attn_implementation=attn_implementation, dtype=dtype)


def pixel_bounds(min_pixels: int, max_pixels: int) -> dict[str, Any]:
    """The image processor's keyword for the contract's pixel bounds (same resize on every version)."""
    return {"size": {"shortest_edge": int(min_pixels), "longest_edge": int(max_pixels)}}
