"""Writing bundles in the release layout: sharded backbone, head, manifests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from .verify import sha256_file

if TYPE_CHECKING:  # pragma: no cover - annotations only: writing a manifest needs no torch
    import torch


def write_manifest(
    bundle: Path,
    name: str = "RELEASE_MANIFEST.json",
    style: Literal["dict", "list"] = "dict",
    revision: str | None = None,
) -> Path:
    """Record sha256 and size of every file in ``bundle`` (except manifests)."""
    skip = {"RELEASE_MANIFEST.json", "worl-bundle.json"}
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name not in skip)
    entries = {p.relative_to(bundle).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size} for p in files}
    if style == "dict":
        body: dict = {"files": entries}
    else:
        body = {"files": [{"path": k, **v} for k, v in entries.items()]}
    if revision is not None:
        body["source"] = {"revision": revision}
    path = bundle / name
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    return path


def write_backbone(
    bundle: Path, state: dict[str, torch.Tensor], shards: int | None = None, max_shard_bytes: int = 2 * 1024**3
) -> None:
    """Sharded safetensors + ``model.safetensors.index.json`` (``shards`` fixed, or by size)."""
    from safetensors.torch import save_file

    keys = sorted(state)
    if shards is None:
        total_bytes = sum(state[k].numel() * state[k].element_size() for k in keys)
        shards = max(1, -(-total_bytes // max_shard_bytes))
    per = -(-len(keys) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[s * per : (s + 1) * per]}
        save_file(part, str(bundle / fname), metadata={"format": "pt"})
        for k, v in part.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (bundle / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
