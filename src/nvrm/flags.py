"""What a settings field says about itself: its help text and how it becomes a CLI flag.

Every settings dataclass (``LoadSettings``, ``Limits``, ``ServeConfig``, ``TrainConfig``,
``JobSettings``) describes its fields with ``meta``; ``nvrm.cli.options`` generates the flags from
them, with defaults read from the fields themselves. ``DTYPE_NAMES`` is the one list of dtypes.
"""

from __future__ import annotations

from typing import Any

DTYPE_NAMES = ("bfloat16", "float16", "float32")
"""Dtypes a backbone or reward head can run in."""


def meta(text: str, **extra: Any) -> dict[str, Any]:
    """Field metadata: ``help`` text, plus ``flag`` (its CLI name), ``choices``, ``cli=False``, ``repeat``."""
    return {"help": text, **extra}
