"""The guard beside a bundle's files: ``nvrm_guard.safetensors``, listed in the bundle's manifest.

The release's own files are never touched: writing a guard adds one file and one manifest entry (its
sha256 and size), so a verified load checks the guard like every other scoring file, and a bundle
without a guard loads exactly as before.
"""

from __future__ import annotations

import json
import warnings
import os
from pathlib import Path
from typing import Any

from ..bundle.layout import MANIFEST_NAMES
from ..bundle.load import weights_fingerprint
from ..bundle.verify import sha256_file
from ..errors import BundleError
from .trust import GUARD_FILE, Guard, load_guard


def read_bundle_guard(bundle: str | Path, preprocessing: str, device: Any = "cpu", own_preprocessing: str | None = None) -> Guard | None:
    """The bundle's guard, checked against its weights and ``preprocessing`` fingerprints; None when it has none.

    ``own_preprocessing``: the fingerprint under the bundle's own contract, when the model is loaded under another
    (an opt-in such as ``short_candidates``). A guard fitted under the bundle's own contract does not describe those
    inputs; the model then runs without it, with one warning (``uncertainty`` None, and ``conservative`` refused as
    for any model without a guard), instead of the load failing. A guard fitted under neither is refused."""
    path = Path(bundle) / GUARD_FILE
    if not path.exists():
        return None
    if not path.is_file():
        raise BundleError(f"{path}: not a regular file; remove it, or fit a guard again with nvrm guard fit")
    weights = weights_fingerprint(bundle)
    if own_preprocessing is not None and own_preprocessing != preprocessing:
        if load_guard(path, model=weights).preprocessing == own_preprocessing:
            warnings.warn(f"{path}: the guard was fitted under the bundle's own contract ({own_preprocessing[:16]}), and this model "
                          f"runs under another ({preprocessing[:16]}): it scores without a guard (uncertainty None); fit one under "
                          "this contract with nvrm guard fit", stacklevel=3)
            return None
    return load_guard(path, model=weights, preprocessing=preprocessing, device=device)


def write_bundle_guard(bundle: str | Path, guard: Guard) -> Path:
    """Write ``guard`` into ``bundle`` (replacing one there) and list it in the bundle's manifest, when it has one."""
    bundle = Path(bundle)
    target = bundle / GUARD_FILE
    tmp = bundle / f".{GUARD_FILE}.{os.getpid()}.tmp"
    guard.save(tmp)
    os.replace(tmp, target)
    for name in MANIFEST_NAMES:
        manifest = bundle / name
        if manifest.is_file():
            list_in_manifest(manifest, target)
            break
    return target


def unlist_in_manifest(manifest: Path, prefix: str) -> None:
    """Drop every entry whose path starts with ``prefix`` from a manifest of either form, keeping the rest."""
    data = _read_manifest(manifest, "fix or restore it")
    files = data.get("files") if isinstance(data, dict) else None
    if isinstance(files, dict):
        data["files"] = {k: v for k, v in files.items() if not k.startswith(prefix)}
    elif isinstance(files, list):
        data["files"] = [f for f in files if not (isinstance(f, dict) and str(f.get("path", "")).startswith(prefix))]
    else:
        return
    _write_manifest(manifest, data)


def list_in_manifest(manifest: Path, file: Path, root: Path | None = None) -> None:
    """Add (or update) ``file``'s entry in a manifest of either form, keeping every other entry and field (its path relative to
    ``root``, the bundle; default: its name)."""
    name = file.relative_to(root).as_posix() if root is not None else file.name
    data = _read_manifest(manifest, "the file was written but is not listed")
    entry = {"sha256": sha256_file(file), "size": file.stat().st_size}
    files = data.get("files") if isinstance(data, dict) else None
    if isinstance(files, dict):
        files[name] = entry
    elif isinstance(files, list):
        data["files"] = [f for f in files if not (isinstance(f, dict) and f.get("path") == name)] + [{"path": name, **entry}]
    else:
        raise BundleError(f"{manifest}: has no 'files' object or list; the file was written but is not listed")
    _write_manifest(manifest, data)


def _read_manifest(manifest: Path, then: str) -> Any:
    try:
        return json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BundleError(f"{manifest}: not valid JSON ({e}); {then}") from e


def _write_manifest(manifest: Path, data: Any) -> None:
    """``data`` as the manifest, atomically (every other entry and field kept by the caller)."""
    tmp = manifest.with_name(f".{manifest.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, manifest)


def guard_for(guard: Guard | None, bundle: str | Path | None, preprocessing: str, device: Any) -> Guard | None:
    """``guard`` on ``device`` if it was fitted for ``bundle``'s weights and this ``preprocessing`` (one line naming both
    fingerprints otherwise); None stays None. A model not loaded from a folder takes any guard."""
    if guard is None:
        return None
    if bundle is not None:
        weights = weights_fingerprint(bundle)
        if guard.model != weights or guard.preprocessing != preprocessing:
            raise BundleError(
                f"this guard was fitted for weights {guard.model[:16] or '?'} under preprocessing {guard.preprocessing[:16] or '?'}; "
                f"the model is {weights[:16]} under {preprocessing[:16]} (fit one for it with nvrm guard fit)"
            )
    return guard.to(device)
