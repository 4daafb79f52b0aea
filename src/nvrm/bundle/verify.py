"""Integrity manifests, the sha256 digest cache, and ``verify_bundle``: every file the scorer reads is listed and matches."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import BundleError, IntegrityError
from .layout import HEAD_FILE, INDEX_FILE, MANIFEST_NAMES, cache_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    sha256: str
    size: int | None


@dataclass(frozen=True)
class IntegrityManifest:
    name: str
    entries: tuple[ManifestEntry, ...]
    revision: str | None


def read_integrity_manifest(bundle: Path) -> IntegrityManifest | None:
    """Parse the first manifest found; both the dict and the list forms are accepted."""
    for name in MANIFEST_NAMES:
        path = bundle / name
        if path.is_file():
            break
    else:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: manifest is not valid JSON ({e})") from e
    files = data.get("files") if isinstance(data, dict) else None
    raw: Iterable[tuple[str, Any]]
    if isinstance(files, dict):
        raw = files.items()
    elif isinstance(files, list):
        raw = [(item.get("path") if isinstance(item, dict) else None, item) for item in files]
    else:
        raise BundleError(f"{path}: manifest needs a 'files' object or list, got {type(files).__name__}")
    entries = []
    for rel, info in raw:
        if not isinstance(rel, str) or not isinstance(info, dict) or not isinstance(info.get("sha256"), str):
            raise BundleError(f"{path}: manifest entry {rel!r} needs a path and a sha256")
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise BundleError(f"{path}: manifest path {rel!r} leaves the bundle")
        size = info.get("size")
        entries.append(ManifestEntry(rel, info["sha256"].lower(), int(size) if size is not None else None))
    source = data.get("source") if isinstance(data.get("source"), dict) else {}
    revision = source.get("revision") or data.get("revision")
    return IntegrityManifest(name, tuple(entries), str(revision) if revision else None)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class DigestCache:
    """sha256 digests of unchanged files, so a 9 GB bundle is hashed once, not on every load.

    The key is (absolute path, size, mtime, ctime, inode). ``touch -r`` can
    restore a file's mtime after an edit but not its ctime, which the kernel
    sets on every change and user space cannot set back; replacing the file
    changes its inode. Threat model: this catches accidental and ordinary
    tampering (an edited, copied-over or replaced file). It does not stand
    against someone who can reset the system clock or write the raw disk
    (root): use ``verify --no-cache`` (``use_cache=False``) to hash every byte.
    """

    def __init__(self, path: Path | None = None):
        self.path = path or (cache_dir() / "digests.json")
        try:
            self._data: dict[str, str] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self._data = {}
        self.hits = 0

    @staticmethod
    def _key(file: Path) -> str:
        st = file.stat()
        return f"{file.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"

    def digest(self, file: Path) -> str:
        key = self._key(file)
        if key in self._data:
            self.hits += 1
            return self._data[key]
        self._data[key] = sha256_file(file)
        return self._data[key]

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._data, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as e:  # a read-only cache only costs speed
            log.warning("could not save digest cache %s: %s", self.path, e)


@dataclass(frozen=True)
class VerifyReport:
    manifest: str | None
    files_checked: int
    cache_hits: int
    revision: str | None


# Files whose presence changes what the runtime computes. In verified mode each
# one that exists must be listed in the manifest.
SCORING_FILES = (
    "config.json",
    INDEX_FILE,
    HEAD_FILE,
    "nvrm_contract.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
    "tokenizer.model",
    "tokenizer.tiktoken",
    "spiece.model",
    "vocab.txt",
    "image_processor_config.json",
)
TEMPLATE_DIRS = ("chat_templates", "additional_chat_templates")
"""Folders of extra chat templates transformers reads (``additional_chat_templates/default.jinja``
replaces the template from ``tokenizer_config.json``): every file in them counts as a scoring file."""


def scoring_files(bundle: Path) -> list[str]:
    """Relative paths of every file present that can change a score (weights, configs, processor, template)."""
    names = {n for n in SCORING_FILES if (bundle / n).is_file()}
    names |= {p.name for p in bundle.glob("*.safetensors") if p.is_file()}
    for folder in TEMPLATE_DIRS:
        templates = bundle / folder
        if templates.is_dir():
            names |= {p.relative_to(bundle).as_posix() for p in templates.rglob("*") if p.is_file()}
    return sorted(names)


def verify_bundle(bundle: str | Path, *, use_cache: bool = True) -> VerifyReport:
    """Check every manifest entry's size and sha256; all mismatches are reported at once."""
    bundle = Path(bundle)
    manifest = read_integrity_manifest(bundle)
    if manifest is None:
        warnings.warn(f"{bundle}: no RELEASE_MANIFEST.json or worl-bundle.json; files are not verified", stacklevel=2)
        return VerifyReport(None, 0, 0, None)
    cache = DigestCache() if use_cache else DigestCache(Path(os.devnull))
    problems = []
    for entry in manifest.entries:
        file = bundle / entry.path
        if not file.is_file():
            problems.append(f"{entry.path} is missing")
            continue
        size = file.stat().st_size
        if entry.size is not None and size != entry.size:
            problems.append(f"{entry.path} is {size} bytes, manifest says {entry.size}")
            continue
        if cache.digest(file) != entry.sha256:
            problems.append(f"{entry.path} sha256 does not match the manifest")
    listed = {e.path for e in manifest.entries}
    for name in scoring_files(bundle):
        if name not in listed:
            problems.append(f"{name} is not listed (in verified mode only listed files may affect scoring; remove it or add it to the manifest)")
    if use_cache:
        cache.save()
    if problems:
        raise IntegrityError(
            f"{bundle}: {len(problems)} file(s) fail {manifest.name}: " + "; ".join(problems)
            + " (re-download the bundle, or pass --no-verify / verify=False to skip)"
        )
    return VerifyReport(manifest.name, len(manifest.entries), cache.hits, manifest.revision)
