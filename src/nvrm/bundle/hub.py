"""Locating a bundle: a local folder, or a Hub repo id downloaded at a pinned revision."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import BundleError, DownloadError
from .layout import DEFAULT_REPO


_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
MAX_REPO_ID = 96
"""The Hub's longest repo id."""


def repo_id_problem(repo: str) -> str | None:
    """Why ``repo`` is not a Hub repo id ``ORG/NAME`` (letters, digits, ``.``, ``_``, ``-``; each part starting and
    ending with a letter or digit, no ``..`` or ``--``, at most 96 characters), or None when it is one."""
    parts = repo.split("/")
    if len(parts) != 2:
        return "it needs exactly one '/'"
    if len(repo) > MAX_REPO_ID:
        return f"it is {len(repo)} characters long; the Hub allows {MAX_REPO_ID}"
    if not all(_REPO_PART.fullmatch(p) for p in parts) or ".." in repo or "--" in repo:
        return "each part is letters, digits, '.', '_' and '-', starts and ends with a letter or digit, and holds no '..' or '--'"
    return None


def resolve_bundle(path_or_repo: str | os.PathLike, revision: str | None = None) -> Path:
    """A local bundle directory, or a Hub repo id downloaded at ``revision``."""
    path = Path(path_or_repo)
    if path.exists():
        if not path.is_dir():
            raise BundleError(f"{path}: a bundle is a directory, got a file")
        return path
    text = str(path_or_repo)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        return download_bundle(text, revision=revision)
    raise BundleError(f"{text}: no such bundle directory (and not a Hub repo id like {DEFAULT_REPO})")


def download_bundle(
    repo: str = DEFAULT_REPO,
    revision: str | None = None,
    local_dir: str | Path | None = None,
    *,
    connect_timeout: float = 10.0,
    read_timeout: float = 30.0,
) -> Path:
    """Download a bundle with huggingface_hub, pinned to ``revision``; fail fast offline.

    Args:
        repo: Hub repo id.
        revision: commit sha to pin (recommended).
        local_dir: download into this folder instead of the Hub cache.
        connect_timeout: seconds for each metadata (etag) request.
        read_timeout: seconds without progress before a file download fails.

    Returns:
        The local bundle folder.
    """
    if (why := repo_id_problem(repo)) is not None:
        raise BundleError(f"{repo[:100]!r} is not a Hub repo id like {DEFAULT_REPO} ({why})")
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

        # huggingface_hub reads its download timeout from this constant at call time and takes no
        # argument for it; the environment variable would be read too late (at its import)
        if "HF_HUB_DOWNLOAD_TIMEOUT" not in os.environ:
            constants.HF_HUB_DOWNLOAD_TIMEOUT = read_timeout
        where = snapshot_download(
            repo_id=repo,
            revision=revision,
            local_dir=str(local_dir) if local_dir else None,
            etag_timeout=connect_timeout,
            allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.md"],
        )
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HfHubHTTPError, OSError) as e:
        reason = " ".join(str(e).split())[:300]
        raise DownloadError(
            f"cannot download {repo}@{revision or 'main'} from the Hugging Face Hub ({type(e).__name__}: {reason}); "
            "check network access, or copy the bundle to a directory and pass its path"
        ) from e
    return Path(where)
