"""Field metadata for the generated command line: what a settings field says about itself (a private leaf).

Every settings dataclass (``LoadSettings``, ``Limits``, ``ServeConfig``, ``TrainConfig``,
``BatchSettings``) describes its fields with ``meta``; ``nvrm.cli.options`` generates the flags from
them, with defaults read from the fields themselves. A leaf module: the settings import it, and
it imports nothing of nvrm (it sat in ``nvrm.cli`` once; nothing below the CLI may import that).
"""

from __future__ import annotations

from typing import Any


def meta(text: str, **extra: Any) -> dict[str, Any]:
    """Field metadata: ``help`` text, plus ``flag`` (its CLI name), ``choices``, ``cli=False``, ``repeat``."""
    return {"help": text, **extra}
