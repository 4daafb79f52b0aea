"""Paths named in manifests (batch jobs, preference pairs): relative ones resolve against the manifest's folder."""

from __future__ import annotations

from pathlib import Path


def resolve_path(base: Path, value: object, what: str) -> str:
    """``value`` as a path, relative ones against ``base``; ValueError naming ``what`` if not a path."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty path string")
    p = Path(value)
    return str(p if p.is_absolute() else base / p)
