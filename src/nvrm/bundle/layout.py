"""Bundle file names, the default Hub repo, and nvrm's cache folder."""

from __future__ import annotations

import os
from pathlib import Path


MANIFEST_NAMES = ("RELEASE_MANIFEST.json", "worl-bundle.json")
HEAD_FILE = "nvrm_head.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_REPO = "Efficient-Large-Model/WORL-NVRM"
ACCEPTED_ARCHITECTURES = ("Qwen3VLModel", "Qwen3VLForConditionalGeneration")


def cache_dir() -> Path:
    """nvrm's own cache (digests, demo bundle): $NVRM_CACHE_DIR or ~/.cache/nvrm."""
    env = os.environ.get("NVRM_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nvrm"
